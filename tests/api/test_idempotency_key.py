"""``Idempotency-Key`` on creating scans and tasks: a retried request creates once and answers as
the first did; the same key with another request is a 409; racing requests with one key create
one resource; keys are per organisation and expire; a malformed key is a 400 that changes nothing."""

from __future__ import annotations

import asyncio
import uuid

from test_operator_api import assert_problem, changes, make_tenant

from support.gateway import RunningGateway

SCAN = {"targets": {"targets": ["192.0.2.10"]}, "profile": [{"task_type": "probe"}]}


async def scans_created(gateway: RunningGateway) -> int:
    return int(await gateway.count("SELECT count(*) FROM events WHERE topic LIKE '%%ScanCreated'"))


async def test_a_retried_scan_creation_creates_once_and_answers_as_the_first(gateway: RunningGateway) -> None:
    tenant = await make_tenant(gateway, "idem")
    key = {"Idempotency-Key": f"scan-{uuid.uuid4()}"}
    first = await gateway.operator("POST", "/v1/scans", SCAN, key=tenant.key, headers=key)
    assert first.status == 201, first.body
    created = await scans_created(gateway)
    again = await gateway.operator("POST", "/v1/scans", SCAN, key=tenant.key, headers=key)
    assert again.status == 201 and again.body["id"] == first.body["id"], again.body
    assert await scans_created(gateway) == created

    before = await changes(gateway)
    other = await gateway.operator("POST", "/v1/scans", {**SCAN, "targets": {"targets": ["192.0.2.11"]}},
                                   key=tenant.key, headers=key)
    assert_problem(other, 409)
    assert other.body["type"].endswith("idempotency-key-reused"), other.body
    assert await changes(gateway) == before

    # The same key in another organisation is another key.
    neighbour = await make_tenant(gateway, "idem-other")
    theirs = await gateway.operator("POST", "/v1/scans", SCAN, key=neighbour.key, headers=key)
    assert theirs.status == 201 and theirs.body["id"] != first.body["id"]


async def test_racing_requests_with_one_key_create_one_scan(gateway: RunningGateway) -> None:
    tenant = await make_tenant(gateway, "idem-race")
    before = await scans_created(gateway)
    key = {"Idempotency-Key": f"race-{uuid.uuid4()}"}
    replies = await asyncio.gather(*(gateway.operator("POST", "/v1/scans", SCAN, key=tenant.key, headers=key)
                                     for _ in range(12)))
    assert {r.status for r in replies} == {201}, [r.body for r in replies if r.status != 201]
    assert len({r.body["id"] for r in replies}) == 1
    assert await scans_created(gateway) == before + 1


async def test_a_retried_task_creation_creates_one_task(gateway: RunningGateway) -> None:
    scan = (await gateway.operator("POST", "/v1/scans", {"organization_id": str(gateway.org)})).body["id"]
    key = {"Idempotency-Key": "task-1"}
    body = {"task_type": "probe", "scope": {"targets": ["192.0.2.10"]}}
    replies = await asyncio.gather(*(gateway.operator("POST", f"/v1/scans/{scan}/tasks", body, headers=key)
                                     for _ in range(6)))
    assert {r.status for r in replies} == {201} and len({r.body["id"] for r in replies}) == 1, replies
    detail = await gateway.operator("GET", f"/v1/scans/{scan}/detail")
    assert detail.body["job_count"] == 1
    refused = await gateway.operator("POST", f"/v1/scans/{scan}/tasks", {**body, "priority": 5}, headers=key)
    assert_problem(refused, 409)


async def test_an_expired_key_may_be_used_again(gateway: RunningGateway) -> None:
    key = {"Idempotency-Key": f"old-{uuid.uuid4()}"}
    body = {"organization_id": str(gateway.org), **SCAN}
    first = await gateway.operator("POST", "/v1/scans", body, headers=key)
    await gateway.execute("UPDATE idempotency_keys SET created_at = created_at - interval '25 hours'")
    later = await gateway.operator("POST", "/v1/scans", body, headers=key)
    assert later.status == 201 and later.body["id"] != first.body["id"]
    assert int(await gateway.count("SELECT count(*) FROM idempotency_keys")) == 1  # the expired row purged


async def test_a_malformed_key_is_refused_and_changes_nothing(gateway: RunningGateway) -> None:
    before = await changes(gateway)
    for value in ("", "x" * 256, "has space", "caf\u00e9"):
        reply = await gateway.operator("POST", "/v1/scans", {"organization_id": str(gateway.org), **SCAN},
                                       headers={"Idempotency-Key": value})
        assert_problem(reply, 400)
        assert "Idempotency-Key" in reply.body["detail"]
    assert await changes(gateway) == before
