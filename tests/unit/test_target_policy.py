"""The target policy (domain.targets), pure: default denials, organisation lists, names by the
addresses they resolve to."""

from __future__ import annotations

import pytest

from leasehold.domain.errors import InvalidRequest
from leasehold.domain.targets import (
    DEFAULT_POLICY,
    TargetRefused,
    check_scope,
    check_target,
    parse_policy,
    target_host,
)


@pytest.mark.parametrize("target", [
    "127.0.0.1", "127.1.2.3", "::1", "[::1]:8080", "169.254.169.254", "http://169.254.169.254/latest/meta-data/",
    "fe80::1", "0.0.0.0", "::ffff:127.0.0.1", "127.0.0.0/30", "169.254.0.0/16", "10.0.0.0/4",
    "metadata.google.internal", "x.metadata.google.internal:80", "fd00:ec2::254", "100.100.100.200"])
def test_loopback_link_local_and_metadata_are_refused_by_default(target: str) -> None:
    with pytest.raises(TargetRefused) as refused:
        check_target(DEFAULT_POLICY, target)
    assert refused.value.status == 403 and target in refused.value.message


@pytest.mark.parametrize(("name", "addresses"), [
    ("localhost", ["127.0.0.1", "::1"]), ("evil.example", ["169.254.169.254"]),
    ("mixed.example", ["93.184.215.14", "127.0.0.1"]), ("v6.example", ["fe80::1%eth0"])])
def test_a_name_is_refused_by_what_it_resolves_to(name: str, addresses: list[str]) -> None:
    with pytest.raises(TargetRefused, match="resolves to it"):
        check_target(DEFAULT_POLICY, f"https://{name}:8443/", addresses)


@pytest.mark.parametrize("target", ["10.0.0.5", "example.com", "https://example.com/", "192.0.2.0/28",
                                    "[2001:db8::1]:443", "172.16.0.1:22"])
def test_ordinary_targets_pass_the_default_policy(target: str) -> None:
    check_target(DEFAULT_POLICY, target, ["93.184.215.14"] if "example" in target else [])


def test_an_explicit_allow_inside_a_default_denied_network_opens_only_that() -> None:
    lab = parse_policy(allow=["127.0.0.0/8"])
    check_target(lab, "127.0.0.1")
    check_target(lab, "10.1.2.3")  # an exception restricts nothing else
    with pytest.raises(TargetRefused):
        check_target(lab, "169.254.169.254")
    with pytest.raises(TargetRefused):  # a broad allow never opens the defaults
        check_target(parse_policy(allow=["0.0.0.0/0"]), "127.0.0.1")


def test_allow_lists_restrict_and_deny_lists_win() -> None:
    policy = parse_policy(allow=["10.0.0.0/8", "corp.example"], deny=["10.9.0.0/16", "secret.corp.example"])
    check_target(policy, "10.1.1.1")
    check_target(policy, "https://www.corp.example/", ["203.0.113.7"])
    for target, addresses in (("10.9.1.1", []), ("192.0.2.1", []), ("other.example", ["10.1.1.1", "192.0.2.1"]),
                              ("db.secret.corp.example", ["10.1.1.1"]), ("www.corp.example", ["10.9.0.3"])):
        with pytest.raises(TargetRefused):
            check_target(policy, target, addresses)
    check_target(policy, "other.example", ["10.1.1.1"])  # every address in an allowed network


def test_scopes_are_checked_target_by_target_and_policies_are_validated() -> None:
    check_scope(DEFAULT_POLICY, {"targets": ["example.com"], "ports": [1]}, {"example.com": ["93.184.215.14"]})
    check_scope(DEFAULT_POLICY, {"hosts": ["127.0.0.1"]})  # not a target list plugins read
    with pytest.raises(TargetRefused):
        check_scope(DEFAULT_POLICY, {"targets": ["example.com", "localhost"]}, {"localhost": ["127.0.0.1"]})
    with pytest.raises(InvalidRequest):
        parse_policy(deny=["not a domain!"])
    assert parse_policy(allow=["EXAMPLE.com.", "10.0.0.1"]).allow == ["10.0.0.1/32", "example.com"]
    assert target_host("[::1]:80").network is not None and target_host("Host.Example:80").name == "host.example"
