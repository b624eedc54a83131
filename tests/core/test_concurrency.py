"""Concurrency claims, shown with many real connections racing (not argued)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from leasehold.domain.errors import IdempotencyConflict, LeaseLost
from leasehold.domain.results import payload_sha256
from support.core import World, rows
from support.locks import rows_locked, waits_while_running


async def test_fifty_acquirers_over_twenty_tasks_never_lease_one_twice(world: World, pool: Any) -> None:
    tasks = {await world.task() for _ in range(20)}
    workers = [await world.worker() for _ in range(50)]
    results = await asyncio.gather(*(world.lifecycle.acquire(w) for w in workers))
    leased = [r.task.id for r in results if r is not None]
    assert len(leased) == 20 and set(leased) == tasks
    assert await rows(pool, "SELECT task_id, count(*) FROM worker_task_attempts GROUP BY task_id"
                      " HAVING count(*) > 1") == []
    assert await rows(pool, "SELECT count(*) FROM worker_tasks WHERE attempt_count = 1") == [(20,)]


async def test_an_acquire_skips_a_task_another_transaction_holds_instead_of_waiting(
        world: World, pool: Any, database_url: str) -> None:
    """``FOR UPDATE SKIP LOCKED``: the task an acquire would pick first is row-locked by an open
    transaction on another connection; the acquire takes the next one at once, waiting for no lock."""
    first = await world.task(priority=9)
    second = await world.task(priority=1)
    worker, other = await world.worker(), await world.worker()
    async with rows_locked(database_url, "SELECT id FROM worker_tasks WHERE id = %s FOR UPDATE", (first,)) as holder:
        job, waiting = await waits_while_running(pool, holder, world.lifecycle.acquire(worker))
    acquired = await asyncio.wait_for(job, 10)
    assert waiting == [], f"the acquire waited for the locked task: {waiting}"
    assert acquired is not None and acquired.task.id == second
    unlocked = await world.lifecycle.acquire(other)  # once let go, the first one is leased as usual
    assert unlocked is not None and unlocked.task.id == first


async def test_capacity_holds_under_twenty_concurrent_acquires(world: World, pool: Any) -> None:
    for _ in range(20):
        await world.task()
    worker = await world.worker(capacity=3)
    results = await asyncio.gather(*(world.lifecycle.acquire(worker) for _ in range(20)))
    assert sum(r is not None for r in results) == 3
    assert await rows(pool, "SELECT count(*) FROM worker_task_attempts WHERE status IN ('leased', 'running')"
                      " AND worker_id = %s", worker) == [(3,)]


async def test_expired_then_reacquired_lease_fences_off_the_old_attempt(world: World, pool: Any) -> None:
    old_worker, new_worker = await world.worker(), await world.worker()
    old = await world.running(old_worker, lease_seconds=10)
    world.clock.advance(11)
    await world.lifecycle.expire_leases()
    world.clock.advance(5)
    new = await world.lifecycle.acquire(new_worker)
    assert new is not None and new.task.id == old.task.id
    lc = world.lifecycle
    records = [{"type": "raw", "from": "old"}]

    async def old_writes() -> list[BaseException | Any]:
        return await asyncio.gather(
            lc.renew(old_worker, old.task.id, old.attempt.id, old.lease_token),
            lc.submit_batch(old_worker, old.task.id, old.attempt.id, old.lease_token, sequence_number=1,
                            idempotency_key="old-1", payload_sha256=payload_sha256(records),
                            records=records, final=True),
            lc.complete(old_worker, old.task.id, old.attempt.id, old.lease_token),
            return_exceptions=True)

    async def new_lifecycle() -> Any:
        await world.final_batch(new_worker, new, key="new-1")
        return await lc.complete(new_worker, new.task.id, new.attempt.id, new.lease_token)

    old_results, done = await asyncio.gather(old_writes(), new_lifecycle())
    assert all(isinstance(r, LeaseLost) for r in old_results), old_results
    assert done.state == "completed" and done.current_attempt.id == new.attempt.id
    assert await rows(pool, "SELECT attempt_id FROM worker_result_batches") == [(new.attempt.id,)]
    rejected = await rows(pool, "SELECT count(*) FROM events WHERE topic LIKE '%%WriteRejected'")
    assert rejected == [(3,)]


async def test_racing_duplicate_batches_are_accepted_once(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    records = [{"type": "asset", "kind": "host", "value": "x"}]
    sha = payload_sha256(records)
    results = await asyncio.gather(*(
        world.lifecycle.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=1,
                                     idempotency_key="same", payload_sha256=sha, records=records, final=True)
        for _ in range(10)), return_exceptions=True)
    acks = [r for r in results if not isinstance(r, BaseException)]
    assert len(acks) == 10, [repr(r) for r in results if isinstance(r, BaseException)]
    assert sum(not ack.duplicate for ack in acks) == 1
    assert len({ack.batch.batch_id for ack in acks}) == 1
    assert await rows(pool, "SELECT count(*) FROM worker_result_batches") == [(1,)]


async def test_racing_batches_with_one_key_and_different_payloads_keep_exactly_one(world: World,
                                                                                   pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    payloads = [[{"type": "raw", "n": n}] for n in range(8)]
    results = await asyncio.gather(*(
        world.lifecycle.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=1,
                                     idempotency_key="k", payload_sha256=payload_sha256(p), records=p,
                                     final=True)
        for p in payloads), return_exceptions=True)
    accepted = [r for r in results if not isinstance(r, BaseException)]
    assert len(accepted) == 1
    assert all(isinstance(r, IdempotencyConflict) for r in results if isinstance(r, BaseException))
    assert await rows(pool, "SELECT count(*) FROM worker_result_batches") == [(1,)]


async def test_identical_acquire_requests_racing_lease_one_task(world: World, pool: Any) -> None:
    for _ in range(5):
        await world.task()
    worker = await world.worker(capacity=5)
    results = await asyncio.gather(*(world.lifecycle.acquire(worker, request_id="req-1") for _ in range(10)),
                                   return_exceptions=True)
    acquired = [r for r in results if not isinstance(r, BaseException)]
    assert len(acquired) == 10, results
    assert len({(a.task.id, a.attempt.id) for a in acquired}) == 1
    assert await rows(pool, "SELECT count(*) FROM worker_task_attempts") == [(1,)]
    # Only the token handed out last still works; the earlier ones were superseded.
    last = await world.lifecycle.acquire(worker, request_id="req-1")
    assert last is not None
    with pytest.raises(LeaseLost):
        await world.lifecycle.renew(worker, last.task.id, last.attempt.id, acquired[0].lease_token)
    renewed = await world.lifecycle.renew(worker, last.task.id, last.attempt.id, last.lease_token)
    assert renewed.task.current_attempt is not None
    assert renewed.task.current_attempt.id == acquired[0].attempt.id
