"""JSON depth and size limits where JSON enters (domain.limits): too deep or too large answers a
4xx problem naming the field and commits nothing; a task that could not be delivered is refused
at creation; the acquire answer is encoded after the lease commits (migration 0022 ended the tasks
stored before the limits whose answer might not encode)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from leasehold.domain.limits import MAX_BODY_DEPTH, MAX_FIELD_BYTES, MAX_FIELD_DEPTH
from leasehold.gateway.api.operator_models import CLIPPED, MAX_DISPLAY_DEPTH
from support.gateway import RunningGateway

TABLES = ("events", "worker_tasks", "worker_task_attempts", "scans", "scheduled_scans", "worker_result_batches")


def nested(levels: int) -> dict[str, Any]:
    """A JSON object nesting ``levels`` deep (``{"a": {"a": … {}}}``)."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


DEEP = "deep-value-goes-here"


def with_deep(body: Any, levels: int) -> bytes:
    """``body`` as JSON with the string DEEP replaced by an object nesting ``levels`` deep (as
    text: the encoder cannot write what the parser accepts, which is the point)."""
    return orjson.dumps(body).replace(orjson.dumps(DEEP), b'{"a":' * (levels - 1) + b"{}" + b"}" * (levels - 1))


async def committed(gateway: RunningGateway) -> dict[str, int]:
    return {table: int(await gateway.count(f"SELECT count(*) FROM {table}")) for table in TABLES}  # noqa: S608


def assert_refused(reply: Any, status: int, field: str) -> None:
    assert reply.status == status, reply.body
    assert reply.headers["Content-Type"].startswith("application/problem+json")
    assert reply.body["field"] == field and field in reply.body["detail"], reply.body


def schedule(targets: Any) -> dict[str, Any]:
    return {"name": "nightly", "interval_seconds": 3600, "targets": targets, "profile": [{"task_type": "probe"}]}


async def test_the_poison_task_is_refused_at_creation_and_commits_nothing(gateway: RunningGateway) -> None:
    before = await committed(gateway)
    reply = await gateway.operator("POST", f"/v1/scans/{gateway.scan}/tasks",
                                   {"task_type": "probe", "scope": nested(252)})
    assert_refused(reply, 422, "scope")
    assert await committed(gateway) == before


@pytest.mark.parametrize("levels", [MAX_FIELD_DEPTH + 1, 100, 254, 255, 300, 1000])
@pytest.mark.parametrize(("where", "field"), [
    ("task", "scope"), ("task", "parameters"), ("scan", "targets"), ("schedule", "targets")])
async def test_operator_fields_nesting_too_deep_answer_4xx_and_commit_nothing(
        gateway: RunningGateway, where: str, field: str, levels: int) -> None:
    before = await committed(gateway)
    if where == "task":
        reply = await gateway.operator("POST", f"/v1/scans/{gateway.scan}/tasks",
                                       raw=with_deep({"task_type": "probe", field: DEEP}, levels))
    elif where == "scan":
        reply = await gateway.operator("POST", "/v1/scans",
                                       raw=with_deep({"organization_id": str(gateway.org), "targets": DEEP}, levels))
    else:
        reply = await gateway.operator("POST", "/v1/schedules",
                                       raw=with_deep({"organization_id": str(gateway.org), **schedule(DEEP)}, levels))
    assert_refused(reply, 422, field)
    assert await committed(gateway) == before


@pytest.mark.parametrize("levels", [MAX_FIELD_DEPTH, 254, 300, 1000])
async def test_result_payloads_nesting_too_deep_answer_422_and_commit_nothing(
        gateway: RunningGateway, levels: int) -> None:
    worker = await gateway.worker()
    await gateway.task()
    lease = (await worker.acquire()).body["lease"]
    records = [{"type": "raw", "deep": DEEP}]  # payload list + record + levels: past the limit
    before = await committed(gateway)
    path = f"/v1/tasks/{lease['task']['id']}/attempts/{lease['attempt_id']}/"
    reply = await worker.post(path + "results", raw=with_deep({
        "lease_token": lease["lease_token"], "sequence_number": 1, "idempotency_key": "deep",
        "payload_sha256": "0" * 64, "payload": records, "final": True}, levels))
    assert_refused(reply, 422, "payload")
    reply = await worker.post(path + "complete", raw=with_deep({
        "lease_token": lease["lease_token"], "final_batch": {
            "sequence_number": 1, "idempotency_key": "deep", "payload_sha256": "0" * 64, "payload": records}},
        levels))
    assert_refused(reply, 422, "payload" if levels + 3 < MAX_BODY_DEPTH else "final_batch")
    assert await committed(gateway) == before


async def test_a_body_deeper_than_the_body_limit_names_its_top_level_field(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    before = await committed(gateway)
    reply = await worker.post("/v1/tasks/acquire", raw=with_deep({"wait_seconds": 0, "x": DEEP}, 300))
    assert_refused(reply, 422, "x")
    assert reply.body["max_depth"] == MAX_BODY_DEPTH
    assert await committed(gateway) == before


async def test_fields_at_the_limit_are_accepted_and_delivered(gateway: RunningGateway) -> None:
    scope = nested(MAX_FIELD_DEPTH)
    reply = await gateway.operator("POST", f"/v1/scans/{gateway.scan}/tasks", {"task_type": "probe", "scope": scope})
    assert reply.status == 201, reply.body
    worker = await gateway.worker()
    lease = (await worker.acquire()).body["lease"]
    assert lease["task"]["scope"] == scope
    records = [{"deep": nested(MAX_FIELD_DEPTH - 2)}]
    assert (await worker.final_batch(lease, records)).status == 200


@pytest.mark.parametrize(("where", "field"), [("task", "scope"), ("task", "parameters"), ("scan", "targets"),
                                               ("schedule", "targets")])
async def test_fields_larger_than_their_limit_answer_413_and_commit_nothing(
        gateway: RunningGateway, where: str, field: str) -> None:
    big = {"blob": "x" * MAX_FIELD_BYTES}
    before = await committed(gateway)
    if where == "task":
        reply = await gateway.operator("POST", f"/v1/scans/{gateway.scan}/tasks", {"task_type": "probe", field: big})
    elif where == "scan":
        reply = await gateway.operator("POST", "/v1/scans", {"organization_id": str(gateway.org), "targets": big})
    else:
        reply = await gateway.operator("POST", "/v1/schedules", {"organization_id": str(gateway.org), **schedule(big)})
    assert_refused(reply, 413, field)
    assert await committed(gateway) == before


async def test_the_acquire_answer_is_encoded_after_the_lease_commits(
        gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder runs once the acquire's transaction committed: an answer that cannot be
    encoded fails the request (500) but leaves the lease on the record, where an encoder inside
    the transaction would have rolled it back. The worker's retry, with the same request id, gets
    the same attempt (a fresh token) once encoding works."""
    task = await gateway.task()

    def unencodable(*args: object, **kwargs: object) -> bytes:
        raise ValueError("cannot encode this answer")

    monkeypatch.setattr("leasehold.gateway.api.worker.encode_acquire_answer", unencodable)
    worker = await gateway.worker()
    failed = await worker.acquire(request_id="one-acquire")
    assert failed.status == 500, failed.body
    assert await gateway.count("SELECT count(*) FROM worker_task_attempts WHERE task_id = %s", task) == 1
    assert await gateway.count("SELECT state FROM worker_tasks WHERE id = %s", task) == "leased"
    monkeypatch.undo()
    retried = await worker.acquire(request_id="one-acquire")
    assert retried.status == 200, retried.body
    assert retried.body["lease"]["task"]["id"] == str(task)
    assert await gateway.count("SELECT count(*) FROM worker_task_attempts WHERE task_id = %s", task) == 1


async def test_the_history_of_a_task_stored_before_the_limits_still_reads(
        gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task created past today's limits (the command layer's check switched off, as before the
    limits existed) nests too deep for a JSON answer once wrapped in a page: its events page
    answers 200, the too-deep part shown as a marker and the event flagged as clipped."""
    monkeypatch.setattr("leasehold.domain.task.check_field", lambda *args, **kwargs: None)
    monkeypatch.setattr("leasehold.domain.scopes.check_field", lambda *args, **kwargs: None)
    task = await gateway.task(scope=nested(252), parameters={"plain": "kept"})
    monkeypatch.undo()
    reply = await gateway.operator("GET", f"/v1/tasks/{task}/events")
    assert reply.status == 200, reply.body
    created = reply.body["items"][0]
    assert created["type"] == "TaskCreated" and created["payload_clipped"] is True
    assert created["payload"]["parameters"] == {"plain": "kept"}
    depth, value = 0, created["payload"]["scope"]
    while isinstance(value, dict):
        depth, value = depth + 1, value["a"]
    assert value == CLIPPED and depth == MAX_DISPLAY_DEPTH - 1
    assert all(item["payload_clipped"] is False for item in reply.body["items"][1:])


async def test_an_ordinary_event_is_not_clipped(gateway: RunningGateway) -> None:
    task = await gateway.task(scope=nested(MAX_FIELD_DEPTH - 1))
    reply = await gateway.operator("GET", f"/v1/tasks/{task}/events")
    assert reply.status == 200, reply.body
    created = reply.body["items"][0]
    assert created["payload_clipped"] is False
    assert created["payload"]["scope"] == nested(MAX_FIELD_DEPTH - 1)
