"""Fair shares over HTTP (a real Gateway, real TLS): only an administrator sets an organisation's
weight and cap, an organisation key reads its own state and nothing of another's, bad input
changes nothing, and /metrics counts leases and waiting time per organisation."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import ssl
from uuid import uuid4

import aiohttp

from support.gateway import ADMIN_KEY, RunningGateway, assert_problem, events_logged, tenant


async def test_an_administrator_sets_weights_and_caps_an_organisation_reads_its_own(gateway: RunningGateway) -> None:
    org, key = await tenant(gateway, "fair-a")
    other, other_key = await tenant(gateway, "fair-b")
    path = f"/v1/organizations/{org}/fair-share"
    r = await gateway.operator("GET", path, key=key)
    assert r.status == 200, r.body
    assert (r.body["weight"], r.body["max_live_attempts"], r.body["live_attempts"], r.body["leases_served"]) == (
        1, None, 0, 0)

    events = await events_logged(gateway)
    assert_problem(await gateway.operator("PUT", path, {"weight": 5, "max_live_attempts": 2}, key=key), 403)
    assert_problem(await gateway.operator("PUT", path, {"weight": 5, "max_live_attempts": 2}, key=other_key), 404)
    assert_problem(await gateway.operator("GET", path, key=other_key), 404)
    for body, status in [({"weight": 0, "max_live_attempts": None}, 422), ({"weight": 1001, "max_live_attempts": 1}, 422),
                         ({"weight": 2}, 422), ({"weight": "2", "max_live_attempts": None}, 422),
                         ({"weight": 2, "max_live_attempts": 0}, 422), ({"weight": 2.5, "max_live_attempts": None}, 422),
                         ({"weight": 2, "max_live_attempts": None, "extra": 1}, 422), ([], 400)]:
        assert_problem(await gateway.operator("PUT", path, body), status)
    assert_problem(await gateway.operator("PUT", "/v1/organizations/not-a-uuid/fair-share",
                                          {"weight": 2, "max_live_attempts": None}), 404)
    assert await events_logged(gateway) == events

    r = await gateway.operator("PUT", path, {"weight": 5, "max_live_attempts": 2})
    assert r.status == 200 and (r.body["weight"], r.body["max_live_attempts"]) == (5, 2), r.body
    assert await events_logged(gateway) == events + 1  # one OrganizationFairShareSet on the organisation's stream
    assert (await gateway.operator("PUT", path, {"weight": 5, "max_live_attempts": 2})).status == 200
    assert await events_logged(gateway) == events + 1  # the same values again: nothing recorded
    r = await gateway.operator("GET", path, key=key)
    assert (r.body["weight"], r.body["max_live_attempts"]) == (5, 2)
    r = await gateway.operator("PUT", path, {"weight": 1, "max_live_attempts": None})
    assert (r.body["weight"], r.body["max_live_attempts"]) == (1, None), r.body
    assert (await gateway.operator("GET", f"/v1/organizations/{other}/fair-share")).status == 200


async def test_a_capped_organisation_over_http_and_its_metrics(gateway: RunningGateway) -> None:
    org = str(gateway.org)
    r = await gateway.operator("PUT", f"/v1/organizations/{org}/fair-share", {"weight": 1, "max_live_attempts": 1})
    assert r.status == 200, r.body
    worker = await gateway.worker(capacity=4)
    await gateway.task()
    await gateway.task()
    first = await worker.acquire()
    assert first.status == 200, first.body
    assert (await worker.acquire()).status == 204  # the cap: one live attempt of the organisation
    state = (await gateway.operator("GET", f"/v1/organizations/{org}/fair-share")).body
    assert (state["live_attempts"], state["leases_served"]) == (1, 1)

    ctx = ssl.create_default_context(cafile=str(gateway.pki.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, \
            s.get(gateway.operator_url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as reply:
        # (series that name organisations are served to an administrator key only)
        text = await reply.text()
    assert f'leasehold_organization_leases_total{{organization="{org}"}} 1.0' in text
    assert f'leasehold_organization_wait_seconds_count{{organization="{org}"}} 1.0' in text


async def test_the_cli_shows_and_sets_an_organisations_fair_share(gateway: RunningGateway) -> None:
    from leasehold.cli.main import main

    url = gateway.settings.resolved_database_url()

    def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["admin", "fair-share", *argv, "--database-url", url])
        return code, out.getvalue(), err.getvalue()

    org = str(gateway.org)
    code, out, _ = await asyncio.to_thread(run, org)
    assert code == 0 and json.loads(out)["weight"] == 1 and json.loads(out)["max_live_attempts"] is None
    code, out, _ = await asyncio.to_thread(run, org, "--weight", "4", "--max-live-attempts", "3")
    assert code == 0 and (json.loads(out)["weight"], json.loads(out)["max_live_attempts"]) == (4, 3)
    code, out, _ = await asyncio.to_thread(run, org, "--no-cap")  # the weight stays
    assert code == 0 and (json.loads(out)["weight"], json.loads(out)["max_live_attempts"]) == (4, None)
    r = await gateway.operator("GET", f"/v1/organizations/{org}/fair-share")
    assert (r.body["weight"], r.body["max_live_attempts"]) == (4, None)

    events = await events_logged(gateway)
    assert (await asyncio.to_thread(run, "nope"))[0] == 2
    assert (await asyncio.to_thread(run, str(uuid4()), "--weight", "2"))[0] == 1
    code, _, err = await asyncio.to_thread(run, org, "--weight", "0")
    assert code == 1 and "weight" in err
    assert await events_logged(gateway) == events
