"""The target policy (domain.targets), pure: default denials, organisation lists, names by the
addresses they resolve to."""

from __future__ import annotations

import ipaddress

import pytest

from leasehold.domain.errors import InvalidRequest
from leasehold.domain.targets import (
    DEFAULT_POLICY,
    MAX_POLICY_ENTRIES,
    TargetHost,
    TargetPolicy,
    TargetRefused,
    check_scope,
    check_target,
    names_of,
    parse_policy,
    policy_from_json,
    target_host,
)
from support.refusals import refused


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


# --- each rule pinned: what a refusal says, where each parsing step stops ----------------------


def _refusal(policy: TargetPolicy, raw: str, addresses: tuple[str, ...] = ()) -> TargetRefused:
    with pytest.raises(TargetRefused) as refused:
        check_target(policy, raw, addresses)
    assert refused.value.details == {"target": raw}
    return refused.value


def test_each_refusal_names_the_target_and_its_rule() -> None:
    assert _refusal(DEFAULT_POLICY, "x.metadata.goog").message == (
        "target 'x.metadata.goog': the domain metadata.goog is denied")
    deny = parse_policy(deny=["2001:db8::/32"])
    assert _refusal(deny, "2001:db8::1").message == (
        "target '2001:db8::1': 2001:db8::1/128 is in the denied network 2001:db8::/32")
    assert _refusal(DEFAULT_POLICY, "127.0.0.1").message == (
        "target '127.0.0.1': 127.0.0.1/32 is in 127.0.0.0/8, denied by default "
        "(loopback, link-local and cloud metadata addresses)")
    assert _refusal(DEFAULT_POLICY, "v6.example", ("fe80::1%eth0",)).message == (
        "target 'v6.example': fe80::1/128 (v6.example resolves to it) is in fe80::/10, denied by default "
        "(loopback, link-local and cloud metadata addresses)")
    assert _refusal(parse_policy(allow=["10.0.0.0/8"]), "192.0.2.1").message == (
        "target '192.0.2.1' is not in the organisation's allow list")


def test_an_address_is_read_up_to_its_zone_and_unreadable_ones_are_skipped() -> None:
    """``fe80::1%eth0`` is fe80::1 (the zone is everything after the first ``%``); an address
    that does not parse is passed over, and the addresses after it are still judged."""
    assert _refusal(parse_policy(deny=["2001:db8::/32"]), "v6.example", ("2001:db8::1%a%b",)).message == (
        "target 'v6.example': 2001:db8::1/128 is in the denied network 2001:db8::/32")
    _refusal(DEFAULT_POLICY, "mixed.example", ("not an address", "127.0.0.1"))
    check_target(DEFAULT_POLICY, "fine.example", ("not an address", "93.184.215.14"))


def test_allow_networks_alone_or_allow_domains_alone_restrict() -> None:
    networks = parse_policy(allow=["10.0.0.0/8"])
    check_target(networks, "10.2.3.4")
    _refusal(networks, "named.example", ("192.0.2.1",))
    domains = parse_policy(allow=["corp.example"])
    check_target(domains, "corp.example", ("192.0.2.1",))
    _refusal(domains, "other.example", ("192.0.2.1",))
    _refusal(domains, "192.0.2.1")


def test_an_ipv4_mapped_network_is_judged_as_ipv4() -> None:
    _refusal(DEFAULT_POLICY, "::ffff:0:0/96")  # all of IPv4, loopback included
    _refusal(DEFAULT_POLICY, "::ffff:127.0.0.1")
    check_target(DEFAULT_POLICY, "::ffff:192.0.2.1")


@pytest.mark.parametrize(("raw", "expected"), [
    ("Example.COM.", TargetHost("Example.COM.", name="example.com")),
    ("https://Example.com:8443/x", TargetHost("https://Example.com:8443/x", name="example.com")),
    ("file:///etc/passwd", TargetHost("file:///etc/passwd", name="")),
    ("example.com/a/b", TargetHost("example.com/a/b", name="example.com")),
    ("10.0.0.1/8", TargetHost("10.0.0.1/8", network=ipaddress.ip_network("10.0.0.0/8"))),
    ("[::1]/path", TargetHost("[::1]/path", network=ipaddress.ip_network("::1"))),
    ("[::1]:80#]", TargetHost("[::1]:80#]", network=ipaddress.ip_network("::1"))),
    ("[2001:db8::2]:443", TargetHost("[2001:db8::2]:443", network=ipaddress.ip_network("2001:db8::2"))),
    ("host]", TargetHost("host]", name="host]")),
    ("fe80::1%eth0", TargetHost("fe80::1%eth0", network=ipaddress.ip_network("fe80::1"))),
    ("fe80::1%a%b", TargetHost("fe80::1%a%b", network=ipaddress.ip_network("fe80::1"))),
    ("db.example:5432", TargetHost("db.example:5432", name="db.example")),
    ("192.0.2.7", TargetHost("192.0.2.7", network=ipaddress.ip_network("192.0.2.7"))),
])
def test_what_a_target_points_at(raw: str, expected: TargetHost) -> None:
    assert target_host(raw) == expected


def test_the_names_of_a_scope_are_listed_once_each_and_addresses_are_not_names() -> None:
    scope = {"targets": ["b.example", "10.0.0.1", "https://a.example/x", "B.example.", "[::1]:80"]}
    assert names_of(scope) == ["b.example", "a.example"]
    assert names_of({"targets": "c.example"}) == ["c.example"]
    assert names_of(None) == [] and names_of({"hosts": ["d.example"]}) == []


def test_policy_entries_are_networks_addresses_or_domains_within_dns_lengths() -> None:
    policy = parse_policy(allow=["10.0.0.1/8", "Sub-Domain_1.Example.", "2001:DB8::1"], deny=["a.example"])
    assert policy.as_json() == {"allow": ["10.0.0.0/8", "2001:db8::1/128", "sub-domain_1.example"],
                                "deny": ["a.example"]}
    label = "a" * 63
    parse_policy(allow=[f"{label}.example"])
    with refused(InvalidRequest, f"target policy entry {'a' * 64 + '.example'!r} is neither a network, an address "
                                 "nor a domain"):
        parse_policy(allow=["a" * 64 + ".example"])
    longest = ".".join([label, label, label, "a" * 61])  # 253 characters
    assert parse_policy(deny=[longest]).deny == [longest]
    for bad in ("", "   ", longest + "a"):
        with refused(InvalidRequest, f"bad target policy entry {bad!r}"):
            parse_policy(deny=[bad])


@pytest.mark.parametrize("which", ["allow", "deny"])
def test_a_policy_list_holds_at_most_a_thousand_entries(which: str) -> None:
    entries = [f"h{i}.example" for i in range(MAX_POLICY_ENTRIES)]
    assert len(getattr(parse_policy(**{which: entries}), which)) == MAX_POLICY_ENTRIES
    with refused(InvalidRequest, f"{which} has more than {MAX_POLICY_ENTRIES} entries"):
        parse_policy(**{which: [*entries, "one-more.example"]})


def test_a_stored_policy_reads_back_both_lists() -> None:
    stored = {"allow": ["10.0.0.0/8"], "deny": ["10.9.0.0/16", "x.example"]}
    assert policy_from_json(stored).as_json() == stored
    assert policy_from_json({"allow": None, "deny": ["x.example"]}).as_json() == {"allow": [], "deny": ["x.example"]}
    assert policy_from_json(None) == policy_from_json({}) == DEFAULT_POLICY
