"""Target policy at creation: scans, schedules and tasks aimed at loopback, link-local or cloud
metadata addresses (or at a name resolving to them) are refused by default and commit nothing;
an organisation's own policy is set through the operator API."""

from __future__ import annotations

import asyncio
import contextlib
import io
from typing import Any

import pytest
from test_operator_api import changes, make_tenant

from leasehold.cli.main import main
from support.gateway import ADMIN_KEY, RunningGateway

REFUSED = ["127.0.0.1", "169.254.169.254", "localhost", "http://localhost:8080/", "https://169.254.169.254/",
           "[::1]:22", "127.0.0.0/28", "metadata.google.internal"]


def schedule(targets: Any) -> dict[str, Any]:
    return {"name": "nightly", "interval_seconds": 3600, "targets": targets, "profile": [{"task_type": "probe"}]}


@pytest.mark.parametrize("target", REFUSED)
async def test_scans_schedules_and_tasks_aimed_at_local_addresses_are_refused_by_default(
        gateway: RunningGateway, target: str) -> None:
    tenant = await make_tenant(gateway)  # the default policy: nothing set
    before = await changes(gateway)
    targets = {"targets": ["192.0.2.10", target]}
    for method, path, body in (
            ("POST", "/v1/scans", {"targets": targets, "profile": [{"task_type": "probe"}]}),
            ("POST", "/v1/schedules", schedule(targets)),
            ("POST", f"/v1/scans/{tenant.scan}/tasks", {"task_type": "probe", "scope": targets})):
        reply = await gateway.operator(method, path, body, key=tenant.key)
        assert reply.status == 403, (path, reply.body)
        assert reply.headers["Content-Type"].startswith("application/problem+json")
        assert reply.body["type"].endswith("/target-refused") and reply.body["target"] == target, reply.body
    assert await changes(gateway) == before


async def test_ordinary_targets_pass_and_the_policy_is_the_organisations_own(gateway: RunningGateway) -> None:
    tenant = await make_tenant(gateway)
    path = f"/v1/organizations/{tenant.org}/target-policy"
    shown = await gateway.operator("GET", path, key=tenant.key)
    assert shown.status == 200 and shown.body["allow"] == shown.body["deny"] == []
    assert {"127.0.0.0/8", "169.254.0.0/16", "::1/128", "fe80::/10"} <= set(shown.body["denied_by_default"])
    ok = await gateway.operator("POST", "/v1/scans", {"targets": {"targets": ["192.0.2.10", "10.1.2.3"]}},
                                key=tenant.key)
    assert ok.status == 201, ok.body

    # An organisation may narrow its own policy…
    set_ = await gateway.operator("PUT", path, {"allow": ["10.0.0.0/8"], "deny": ["10.9.0.0/16"]}, key=tenant.key)
    assert set_.status == 200 and set_.body["allow"] == ["10.0.0.0/8"], set_.body
    for target, status in (("10.1.2.3", 201), ("192.0.2.10", 403), ("10.9.0.1", 403)):
        reply = await gateway.operator("POST", "/v1/scans", {"targets": {"targets": [target]}}, key=tenant.key)
        assert reply.status == status, (target, reply.body)
    # …but opening a default-denied network takes an administrator.
    before = await changes(gateway)
    refused = await gateway.operator("PUT", path, {"allow": ["127.0.0.0/8"]}, key=tenant.key)
    assert refused.status == 403, refused.body
    assert await changes(gateway) == before
    opened = await gateway.operator("PUT", path, {"allow": ["127.0.0.1/32"]}, key=ADMIN_KEY)
    assert opened.status == 200, opened.body
    reply = await gateway.operator("POST", "/v1/scans", {"targets": {"targets": ["127.0.0.1", "192.0.2.1"]}},
                                   key=tenant.key)
    assert reply.status == 201, reply.body
    assert await gateway.count("SELECT count(*) FROM events WHERE originator_id = %s AND topic LIKE %s",
                               tenant.org, "%OrganizationTargetPolicySet") == 2


@pytest.mark.parametrize("body", [{"allow": ["not a network or domain"]}, {"deny": [5]}, {"allow": "10.0.0.0/8"}])
async def test_bad_policies_are_refused(gateway: RunningGateway, body: dict[str, Any]) -> None:
    before = await changes(gateway)
    reply = await gateway.operator("PUT", f"/v1/organizations/{gateway.org}/target-policy", body)
    assert reply.status == 422, reply.body
    assert await changes(gateway) == before


async def test_the_cli_shows_and_replaces_a_policy(gateway: RunningGateway) -> None:
    url = gateway.settings.database_url
    assert url is not None

    def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["admin", "target-policy", *argv, "--database-url", url])
        return code, out.getvalue(), err.getvalue()

    tenant = await make_tenant(gateway)
    code, out, _ = await asyncio.to_thread(run, str(tenant.org))
    assert code == 0 and "allow: (none)" in out and "127.0.0.0/8" in out, out
    code, out, _ = await asyncio.to_thread(run, str(tenant.org), "--allow", "10.0.0.0/8", "--deny", "bad.example")
    assert code == 0 and "allow: 10.0.0.0/8" in out and "deny: bad.example" in out, out
    shown = await gateway.operator("GET", f"/v1/organizations/{tenant.org}/target-policy", key=tenant.key)
    assert (shown.body["allow"], shown.body["deny"]) == (["10.0.0.0/8"], ["bad.example"])
    refused = await gateway.operator("POST", "/v1/scans", {"targets": {"targets": ["192.0.2.1"]}}, key=tenant.key)
    assert refused.status == 403, refused.body
    code, out, _ = await asyncio.to_thread(run, str(tenant.org), "--clear")
    assert code == 0 and "allow: (none)" in out, out
    before = await changes(gateway)
    assert (await asyncio.to_thread(run, "nope"))[0] == 2
    assert (await asyncio.to_thread(run, str(tenant.org), "--allow", "not a thing!"))[0] == 1
    assert await changes(gateway) == before
