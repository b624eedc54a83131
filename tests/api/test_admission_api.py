"""Admission caps over HTTP (a real Gateway): only an administrator sets them, with a reason; an
organisation key reads its own and nothing of another's; a creation past a cap is a 429
problem with a Retry-After that changes nothing (no event, no row, no idempotency key); the
refusals are counted in /metrics; the typed client and the command line set and read them."""

from __future__ import annotations

import ssl
import uuid

import aiohttp
import pytest
from test_finding_work_cli import leasehold

from leasehold.client import ApiError, OperatorClient
from leasehold.domain.admission import RETRY_AFTER_SECONDS
from support.gateway import ADMIN_KEY, RunningGateway, assert_problem, events_logged, tenant
from support.slim import without_server_env

SCAN = {"targets": {"targets": ["192.0.2.10"]}, "profile": [{"task_type": "probe"}]}


async def _counts(gateway: RunningGateway) -> tuple[int, int, int, int]:
    return (await events_logged(gateway), int(await gateway.count("SELECT count(*) FROM scans")),
            int(await gateway.count("SELECT count(*) FROM worker_tasks")),
            int(await gateway.count("SELECT count(*) FROM idempotency_keys")))


async def test_only_an_administrator_sets_the_caps_and_bad_input_changes_nothing(gateway: RunningGateway) -> None:
    org, key = await tenant(gateway, "adm-a")
    _other, other_key = await tenant(gateway, "adm-b")
    path = f"/v1/organizations/{org}/admission"
    r = await gateway.operator("GET", path, key=key)
    assert r.status == 200, r.body
    assert r.body == {"organization_id": org, "max_queued_tasks": None, "max_queued_scans": None,
                      "queued_tasks": 0, "queued_scans": 0}
    body = {"max_queued_tasks": 5, "max_queued_scans": 2, "reason": "flooding the queue"}
    before = await events_logged(gateway)
    assert_problem(await gateway.operator("PUT", path, body, key=key), 403)
    assert_problem(await gateway.operator("PUT", path, body, key=other_key), 404)
    assert_problem(await gateway.operator("GET", path, key=other_key), 404)
    assert_problem(await gateway.operator("PUT", f"/v1/organizations/{uuid.uuid4()}/admission", body), 404)
    for bad in [{**body, "max_queued_tasks": -1}, {**body, "max_queued_scans": 1_000_001}, {**body, "reason": ""},
                {"max_queued_tasks": 1, "reason": "x"}, {**body, "max_queued_tasks": "3"},
                {**body, "extra": 1}, {**body, "reason": "x" * 501}]:
        assert_problem(await gateway.operator("PUT", path, bad), 422)
    assert await events_logged(gateway) == before

    r = await gateway.operator("PUT", path, body)
    assert r.status == 200 and (r.body["max_queued_tasks"], r.body["max_queued_scans"]) == (5, 2), r.body
    assert await events_logged(gateway) == before + 1
    assert (await gateway.operator("PUT", path, {**body, "reason": "again"})).status == 200
    assert await events_logged(gateway) == before + 1  # the same caps again: nothing recorded


async def test_a_creation_past_a_cap_is_a_429_that_changes_nothing(gateway: RunningGateway) -> None:
    org, key = await tenant(gateway, "adm-429")
    path = f"/v1/organizations/{org}/admission"
    assert (await gateway.operator("PUT", path, {"max_queued_tasks": 1, "max_queued_scans": 1,
                                                 "reason": "test"})).status == 200
    scan = await gateway.operator("POST", "/v1/scans", {"targets": {"targets": ["192.0.2.10"]}}, key=key)
    assert scan.status == 201, scan.body
    task = {"task_type": "probe"}
    tasks_path = f"/v1/scans/{scan.body['id']}/tasks"
    assert (await gateway.operator("POST", tasks_path, task, key=key)).status == 201
    before = await _counts(gateway)
    idempotent = {"Idempotency-Key": f"adm-{uuid.uuid4()}"}
    refused = await gateway.operator("POST", tasks_path, task, key=key, headers=idempotent)
    assert_problem(refused, 429)
    assert refused.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    assert (refused.body["type"].rsplit("/", 1)[-1], refused.body["kind"], refused.body["cap"], refused.body["queued"]) == (
        "admission-refused", "task", 1, 1)
    assert await _counts(gateway) == before

    refused = await gateway.operator("POST", "/v1/scans", SCAN, key=key, headers=idempotent)
    assert_problem(refused, 429)
    assert refused.headers["Retry-After"] == str(RETRY_AFTER_SECONDS) and refused.body["kind"] == "scan"
    assert await _counts(gateway) == before
    state = (await gateway.operator("GET", path, key=key)).body
    assert (state["queued_tasks"], state["queued_scans"]) == (1, 1)

    # Lifting the caps lets the same request (and its key) through.
    assert (await gateway.operator("PUT", path, {"max_queued_tasks": None, "max_queued_scans": None,
                                                 "reason": "lifted"})).status == 200
    assert (await gateway.operator("POST", "/v1/scans", SCAN, key=key, headers=idempotent)).status == 201

    ctx = ssl.create_default_context(cafile=str(gateway.pki.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, \
            s.get(gateway.operator_url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as reply:
        text = await reply.text()
    assert 'leasehold_admission_refused_total{kind="task"} 1.0' in text
    assert 'leasehold_admission_refused_total{kind="scan"} 1.0' in text


async def test_the_typed_client_sets_and_reads_the_caps_and_sees_the_429(gateway: RunningGateway) -> None:
    async with OperatorClient(gateway.operator_url, ADMIN_KEY, ca_file=str(gateway.pki.ca_cert)) as admin:
        org = await admin.create_organization(f"adm-client-{uuid.uuid4().hex[:8]}")
        state = await admin.set_admission(org.id, max_queued_tasks=3, max_queued_scans=0, reason="paused intake")
        assert (state.max_queued_tasks, state.max_queued_scans, state.queued_scans) == (3, 0, 0)
        assert (await admin.get_admission(org.id)).max_queued_scans == 0
        with pytest.raises(ApiError) as refused:
            await admin.create_scan(organization_id=org.id, targets={"targets": ["192.0.2.10"]})
        assert (refused.value.status, refused.value.retry_after) == (429, RETRY_AFTER_SECONDS)
        with pytest.raises(ApiError) as missing:
            await admin.set_admission(uuid.uuid4(), max_queued_tasks=None, max_queued_scans=None, reason="x")
        assert missing.value.status == 404


@pytest.fixture(scope="module")
def base_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return without_server_env(tmp_path_factory.mktemp("client-only"))


async def test_the_command_line_sets_and_shows_the_caps(gateway: RunningGateway, base_env: dict[str, str]) -> None:
    org, _key = await tenant(gateway, "adm-cli")
    code, out, err = await leasehold(gateway, base_env, "organizations", "admission", org, "--max-queued-tasks", "4",
                                     "--no-scan-cap", "--reason", "noisy tenant")
    assert code == 0, err
    assert "queued tasks 0 (cap 4)" in out and "queued scans 0 (cap none)" in out, out
    before = await events_logged(gateway)
    code, _, err = await leasehold(gateway, base_env, "organizations", "admission", org, "--max-queued-tasks", "4")
    assert code == 2 and "--reason" in err, err
    assert await events_logged(gateway) == before
    code, out, err = await leasehold(gateway, base_env, "organizations", "admission", org, "--json")
    assert code == 0 and '"max_queued_tasks":4' in out.replace(" ", ""), (out, err)


async def test_the_console_overview_shows_the_caps_to_whom_may_see_them(gateway: RunningGateway) -> None:
    from support.console import signed_in

    org, key = await tenant(gateway, "adm-console")
    other, _ = await tenant(gateway, "adm-console-other")
    for capped in (org, other):
        assert (await gateway.operator("PUT", f"/v1/organizations/{capped}/admission", {
            "max_queued_tasks": 7, "max_queued_scans": None, "reason": "console"})).status == 200
    admin_rows = (await (await signed_in(gateway)).get("/console")).rows("Admission caps")
    assert [org, "0", "7", "0", "none"] in admin_rows and other in {r[0] for r in admin_rows}
    own_rows = (await (await signed_in(gateway, key)).get("/console")).rows("Admission caps")
    assert own_rows == [[org, "0", "7", "0", "none"]]
