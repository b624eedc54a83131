"""Every stored row reads: a value stored before the input limits (written here straight into its
row with SQL: jsonb nesting 300 deep, or a number past 64 bits or past a double's range) never
makes a read route answer 500. The field is clipped and ``<field>_clipped`` says so; a command on
such a task commits its event once and answers 2xx."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest

from leasehold.gateway.api.operator_models import CLIPPED, CLIPPED_NUMBER, MAX_DISPLAY_DEPTH
from support.gateway import RunningGateway

#: jsonb nesting 300 deep: past what orjson writes (254) and what an answer shows.
DEEP = '{"a": ' * 300 + "1" + "}" * 300
#: A number past 64 bits, within a double's range: it reads as a double.
HUGE = '{"n": 1' + "0" * 30 + "}"
#: A number past a double's range: orjson cannot read it, so it reads as a Python int no answer can hold.
VAST = '{"n": 1' + "0" * 400 + "}"
STORED = {"deep": DEEP, "vast": VAST}


def assert_clipped(value: Any, kind: str) -> None:
    """``value`` (a stored DEEP/HUGE/VAST as answered) holds the marker in place of what cannot be shown."""
    if kind == "deep":
        depth = 0
        while isinstance(value, dict):
            depth, value = depth + 1, value["a"]
        assert value == CLIPPED and depth == MAX_DISPLAY_DEPTH
    else:
        assert value == {"n": CLIPPED_NUMBER}


async def set_column(gateway: RunningGateway, table: str, column: str, row_id: UUID, value: str) -> None:
    async with gateway.pool.connection() as conn:
        await conn.execute(f"UPDATE {table} SET {column} = %s::jsonb WHERE id = %s",  # noqa: S608
                           (value, row_id))


async def events_of(gateway: RunningGateway, task: UUID, kind: str) -> int:
    return int(await gateway.count(
        "SELECT count(*) FROM events WHERE originator_id = %s AND topic LIKE %s", task, f"%:{kind}"))


@pytest.mark.parametrize("kind", ["deep", "vast"])
@pytest.mark.parametrize("field", ["scope", "parameters"])
async def test_a_task_with_an_unencodable_stored_field_reads_clipped(
        gateway: RunningGateway, field: str, kind: str) -> None:
    task = await gateway.task(parameters={"plain": "kept"} if field == "scope" else {})
    await set_column(gateway, "worker_tasks", field, task, STORED[kind])
    reply = await gateway.operator("GET", f"/v1/tasks/{task}")
    assert reply.status == 200, reply.body
    assert reply.body[f"{field}_clipped"] is True
    assert_clipped(reply.body[field], kind)
    other = "parameters" if field == "scope" else "scope"
    assert reply.body[f"{other}_clipped"] is False
    events = await gateway.operator("GET", f"/v1/tasks/{task}/events")
    assert events.status == 200, events.body


async def test_a_number_past_64_bits_reads_as_a_double(gateway: RunningGateway) -> None:
    task = await gateway.task()
    await set_column(gateway, "worker_tasks", "scope", task, HUGE)
    reply = await gateway.operator("GET", f"/v1/tasks/{task}")
    assert reply.status == 200, reply.body
    assert reply.body["scope"] == {"n": 1e30} and reply.body["scope_clipped"] is False


async def test_task_lists_read_past_such_tasks(gateway: RunningGateway) -> None:
    for value in (DEEP, VAST):
        await set_column(gateway, "worker_tasks", "scope", await gateway.task(), value)
    listed = await gateway.operator("GET", f"/v1/tasks?scan_id={gateway.scan}")
    assert listed.status == 200 and len(listed.body["items"]) == 2, listed.body
    detail = await gateway.operator("GET", f"/v1/scans/{gateway.scan}/detail")
    assert detail.status == 200, detail.body


async def test_an_ordinary_task_is_not_clipped(gateway: RunningGateway) -> None:
    task = await gateway.task(scope={"assets": [{"kind": "host", "value": "a"}]}, parameters={"n": 2**63})
    reply = await gateway.operator("GET", f"/v1/tasks/{task}")
    assert reply.status == 200, reply.body
    assert (reply.body["scope_clipped"], reply.body["parameters_clipped"]) == (False, False)
    assert reply.body["parameters"] == {"n": 2**63}


@pytest.mark.parametrize("kind", ["deep", "vast"])
async def test_cancel_of_such_a_task_commits_its_event_once_and_answers_200(
        gateway: RunningGateway, kind: str) -> None:
    task = await gateway.task()
    await set_column(gateway, "worker_tasks", "scope", task, STORED[kind])
    reply = await gateway.operator("POST", f"/v1/tasks/{task}/cancel", {"reason": "stop"})
    assert reply.status == 200, reply.body
    assert reply.body["state"] == "cancelled" and reply.body["scope_clipped"] is True
    assert await events_of(gateway, task, "TaskCancelled") == 1


@pytest.mark.parametrize("kind", ["deep", "vast"])
async def test_retry_of_such_a_task_commits_its_event_once_and_answers_200(
        gateway: RunningGateway, kind: str) -> None:
    task = await gateway.task(max_attempts=1)
    worker = await gateway.worker()
    lease = (await worker.acquire()).body["lease"]
    assert (await worker.write(lease, "fail", error="boom", retryable=False)).status == 200
    await set_column(gateway, "worker_tasks", "parameters", task, STORED[kind])
    reply = await gateway.operator("POST", f"/v1/tasks/{task}/retry", {"reason": "again"})
    assert reply.status == 200, reply.body
    assert reply.body["state"] == "pending" and reply.body["parameters_clipped"] is True
    assert await events_of(gateway, task, "TaskRetried") == 1


@pytest.mark.parametrize("kind", ["deep", "vast"])
async def test_scans_and_their_lists_read_with_unencodable_targets(gateway: RunningGateway, kind: str) -> None:
    await set_column(gateway, "scans", "targets", gateway.scan, STORED[kind])
    for path in (f"/v1/scans/{gateway.scan}", f"/v1/scans/{gateway.scan}/detail", "/v1/scans"):
        reply = await gateway.operator("GET", path)
        assert reply.status == 200, (path, reply.body)
        scan = reply.body if path.endswith(str(gateway.scan)) else (
            reply.body["scan"] if path.endswith("detail") else next(
                s for s in reply.body["items"] if s["id"] == str(gateway.scan)))
        assert scan["targets_clipped"] is True and scan["profile_clipped"] is False
        assert_clipped(scan["targets"], kind)


@pytest.mark.parametrize("kind", ["deep", "vast"])
async def test_schedules_read_with_unencodable_targets(gateway: RunningGateway, kind: str) -> None:
    created = await gateway.operator("POST", "/v1/schedules", {
        "organization_id": str(gateway.org), "name": "nightly", "interval_seconds": 3600,
        "targets": {"targets": ["192.0.2.10"]}, "profile": [{"task_type": "probe"}]})
    assert created.status == 201, created.body
    schedule = UUID(created.body["id"])
    await set_column(gateway, "scheduled_scans", "targets", schedule, STORED[kind])
    one = await gateway.operator("GET", f"/v1/schedules/{schedule}")
    assert one.status == 200, one.body
    assert one.body["targets_clipped"] is True and one.body["profile_clipped"] is False
    assert_clipped(one.body["targets"], kind)
    listed = await gateway.operator("GET", "/v1/schedules")
    assert listed.status == 200, listed.body
    assert listed.body["items"][0]["targets_clipped"] is True
    paused = await gateway.operator("POST", f"/v1/schedules/{schedule}/pause")
    assert paused.status == 200 and paused.body["targets_clipped"] is True, paused.body


@pytest.mark.parametrize("kind", ["deep", "vast"])
async def test_assets_and_threats_read_with_unencodable_stored_data(gateway: RunningGateway, kind: str) -> None:
    worker = await gateway.worker()
    await gateway.task()
    lease = (await worker.acquire()).body["lease"]
    records = [{"type": "asset", "kind": "host", "value": "a.example"},
               {"type": "threat", "external_id": "CVE-1", "title": "t"}]
    assert (await worker.final_batch(lease, records)).status == 200
    async with gateway.pool.connection() as conn:
        await conn.execute("UPDATE assets SET attributes = %s::jsonb", (STORED[kind],))
        await conn.execute("UPDATE threats SET data = %s::jsonb", (STORED[kind],))
    for path in (f"/v1/scans/{gateway.scan}/assets", f"/v1/organizations/{gateway.org}/assets"):
        reply = await gateway.operator("GET", path)
        assert reply.status == 200, (path, reply.body)
        (asset,) = reply.body["items"]
        assert asset["attributes_clipped"] is True
        assert_clipped(asset["attributes"], kind)
    reply = await gateway.operator("GET", f"/v1/organizations/{gateway.org}/threats")
    assert reply.status == 200, reply.body
    (threat,) = reply.body["items"]
    assert threat["data_clipped"] is True
    assert_clipped(threat["data"], kind)
