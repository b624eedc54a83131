"""``complete`` carrying the attempt's final batch: one transaction that is exactly ``submit_batch``
(final) followed by ``complete``, with the same idempotency and the same refusals."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest

from leasehold.domain.errors import IdempotencyConflict, InvalidRequest, InvalidTransition
from leasehold.domain.results import payload_sha256
from leasehold.gateway.commands.lifecycle import ResultBatch
from support.core import World, event_count

RECORDS = [{"type": "asset", "kind": "host", "value": "10.0.0.7"}]


async def _rows(pool: Any, query: str, *params: object) -> list[tuple[Any, ...]]:
    async with pool.connection() as conn:
        cur = await conn.execute(query, params)
        return list(await cur.fetchall())


async def _events(pool: Any, task: UUID) -> list[tuple[str, str]]:
    return [(topic.split(":")[1], str(xid)) for topic, xid in await _rows(
        pool, "SELECT topic, transaction_id FROM events WHERE originator_id = %s ORDER BY originator_version", task)]


def _final(records: list[Any] = RECORDS, *, key: str = "last", sequence: int = 1) -> ResultBatch:
    return ResultBatch(sequence, key, payload_sha256(records), records)


async def test_the_final_batch_and_the_completion_commit_together(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    task = await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token, final_batch=_final())
    assert task.state == "completed" and task.current_attempt is not None
    assert task.current_attempt.final_batch_accepted
    events = await _events(pool, a.task.id)
    assert [name for name, _ in events[-2:]] == ["ResultBatchAccepted", "TaskCompleted"]
    assert events[-2][1] == events[-1][1]  # one transaction
    assert await _rows(pool, "SELECT sequence_number, idempotency_key, final FROM worker_result_batches"
                             " WHERE task_id = %s", a.task.id) == [(1, "last", True)]
    assert await _rows(pool, "SELECT kind, value FROM assets") == [("host", "10.0.0.7")]  # ingested
    assert await _rows(pool, "SELECT status FROM scans WHERE id = %s", world.scan) == [("success",)]


async def test_a_leased_attempt_is_started_by_its_final_batch(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.leased(worker)
    await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token, final_batch=_final())
    assert [name for name, _ in await _events(pool, a.task.id)] == [
        "TaskCreated", "TaskLeased", "TaskStarted", "ResultBatchAccepted", "TaskCompleted"]


async def test_repeating_it_changes_nothing(world: World, pool: Any) -> None:
    """A worker whose answer was lost sends the same request again."""
    worker = await world.worker()
    a = await world.running(worker)
    first = await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token, final_batch=_final())
    before = await event_count(pool)
    again = await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token, final_batch=_final())
    assert again.state == first.state == "completed" and await event_count(pool) == before


async def test_the_same_key_with_other_records_is_refused_and_nothing_completes(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    await world.lifecycle.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=1,
                                       idempotency_key="last", payload_sha256=payload_sha256(RECORDS),
                                       records=RECORDS, final=False)
    other = [{"type": "asset", "kind": "host", "value": "10.0.0.8"}]
    with pytest.raises(IdempotencyConflict):
        await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token,
                                       final_batch=_final(other, key="last", sequence=2))
    assert await _rows(pool, "SELECT state FROM worker_tasks WHERE id = %s", a.task.id) == [("running",)]
    assert [name for name, _ in await _events(pool, a.task.id)][-1] == "WriteRejected"


async def test_an_out_of_order_batch_is_refused_and_the_task_stays_running(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    with pytest.raises(InvalidTransition):
        await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token,
                                       final_batch=_final(sequence=2))
    assert await _rows(pool, "SELECT state FROM worker_tasks WHERE id = %s", a.task.id) == [("running",)]
    assert await _rows(pool, "SELECT count(*) FROM worker_result_batches") == [(0,)]


async def test_records_not_matching_their_sha_change_nothing(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    before = await event_count(pool)
    bad = ResultBatch(1, "last", payload_sha256([{"type": "raw"}]), RECORDS)
    with pytest.raises(InvalidRequest, match="payload_sha256"):
        await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token, final_batch=bad)
    assert await event_count(pool) == before


async def test_a_batch_sent_with_complete_is_final(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    before = await event_count(pool)
    not_final = ResultBatch(1, "last", payload_sha256(RECORDS), RECORDS, final=False)
    with pytest.raises(InvalidRequest, match="final"):
        await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token, final_batch=not_final)
    assert await event_count(pool) == before
