"""The sweeper's own SQL guard: each sweep statement locks the tasks it is due to change and no
other, even though the domain re-checks every task it is handed.

Without the guard (the ``WHERE`` of ``tasks_lock_expired_leases``, ``tasks_lock_past_deadline``
or ``tasks_lock_cancelling_overdue``) the domain would still refuse to touch a healthy lease, so
no task would change, but every sweep would row-lock every live task until it commits: each
renewal, progress report and result batch of the fleet would queue behind the sweeper. So the
test pauses a sweep right after its locking statement and, from another session, locks every
task that is not due with ``FOR UPDATE NOWAIT``, which fails at once on a row the sweep holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import psycopg
import pytest

from leasehold.gateway.commands.lifecycle import Lifecycle
from leasehold.persistence.transaction import Row, Transaction
from support.core import World

LIVE_LEASES = 120  # more than a sweep's batch of 100
CANCELLING_IN_GRACE = 5
PENDING = 20
FINISHED = 3  # completed, failed and cancelled, their leases and deadlines long past
SWEEPS: dict[str, Callable[[Lifecycle], Awaitable[int]]] = {
    "tasks_lock_expired_leases": lambda lc: lc.expire_leases(),
    "tasks_lock_past_deadline": lambda lc: lc.exceed_deadlines(),
    "tasks_lock_cancelling_overdue": lambda lc: lc.terminate_cancelling(),
}
# The one task each sweep is due to change, as TaskSpec fields (and whether it is cancelled).
DUE: dict[str, tuple[dict[str, int], bool]] = {
    "tasks_lock_expired_leases": ({"lease_seconds": 30, "execution_timeout_seconds": 3600}, False),
    "tasks_lock_past_deadline": ({"lease_seconds": 600, "execution_timeout_seconds": 40}, False),
    "tasks_lock_cancelling_overdue": ({"lease_seconds": 600, "execution_timeout_seconds": 3600}, True),
}


class PausedSweep:
    """Holds a sweep inside its transaction right after the statement ``query`` locked its rows,
    until :meth:`resume`; keeps the rows that statement returned."""

    def __init__(self, query: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.query = query
        self.locked = asyncio.Event()
        self._resume = asyncio.Event()
        self.rows: list[Row] = []
        original = Transaction.all

        async def all_then_pause(tx: Transaction, name: str, params: Any) -> list[Row]:
            found = await original(tx, name, params)
            if name == self.query:
                self.rows = found
                self.locked.set()
                await self._resume.wait()
            return found

        monkeypatch.setattr(Transaction, "all", all_then_pause)

    def resume(self) -> None:
        self._resume.set()


async def tasks_by_id(pool: Any) -> dict[UUID, tuple[int, str]]:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT id, version, state FROM worker_tasks")
        return {r[0]: (r[1], r[2]) for r in await cur.fetchall()}


async def a_fleet_with_one_due_task(world: World, query: str) -> UUID:
    """At the world's clock: one task due for ``query``'s sweep, and beside it LIVE_LEASES healthy
    leases (some running), CANCELLING_IN_GRACE cancellations still within their grace period,
    PENDING tasks no worker took and FINISHED tasks whose attempts' leases and deadlines passed."""
    lc = world.lifecycle
    worker = await world.worker(capacity=LIVE_LEASES + CANCELLING_IN_GRACE + 1)
    # A scan of their own, created first: the world's scan stays open for the tasks after them.
    other = await world.scans.create_scan(world.org, {"targets": ["127.0.0.1"]})
    for _ in range(FINISHED):
        await world.task(scan=other, lease_seconds=30, execution_timeout_seconds=40)
    done, failed, cancelled = [await lc.acquire(worker) for _ in range(FINISHED)]
    assert done is not None and failed is not None and cancelled is not None
    await lc.mark_running(worker, done.task.id, done.attempt.id, done.lease_token)
    await world.final_batch(worker, done)
    await lc.complete(worker, done.task.id, done.attempt.id, done.lease_token)
    await lc.fail(worker, failed.task.id, failed.attempt.id, failed.lease_token, error="x", retryable=False)
    await lc.request_cancel(cancelled.task.id)
    await lc.acknowledge_cancel(worker, cancelled.task.id, cancelled.attempt.id, cancelled.lease_token)
    spec, cancel = DUE[query]
    due = await world.leased(worker, **spec)
    if cancel:
        await lc.request_cancel(due.task.id)
    world.clock.advance(50)  # the due task's lease, deadline or grace (30 s) runs out at 61 s
    for _ in range(LIVE_LEASES + CANCELLING_IN_GRACE):
        await world.task(lease_seconds=600, execution_timeout_seconds=3600)
    live = [await lc.acquire(worker) for _ in range(LIVE_LEASES + CANCELLING_IN_GRACE)]
    for n, a in enumerate(live):
        assert a is not None
        if n % 2:
            await lc.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
        if n < CANCELLING_IN_GRACE:
            await lc.request_cancel(a.task.id)
    for _ in range(PENDING):
        await world.task()
    world.clock.advance(11)
    return due.task.id


@pytest.mark.parametrize("query", list(SWEEPS))
async def test_a_sweep_locks_only_the_tasks_it_is_due_to_change(world: World, database_url: str,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               query: str) -> None:
    due = await a_fleet_with_one_due_task(world, query)
    before = await tasks_by_id(world.pool)
    others = sorted(set(before) - {due})
    assert len(others) == LIVE_LEASES + CANCELLING_IN_GRACE + PENDING + FINISHED

    paused = PausedSweep(query, monkeypatch)
    sweep = asyncio.ensure_future(SWEEPS[query](world.lifecycle))
    try:
        await asyncio.wait_for(paused.locked.wait(), timeout=30)
        assert [task_id for task_id, _ in paused.rows] == [due]
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            async with conn.transaction():  # every other task is free while the sweep holds its locks
                cur = await conn.execute("SELECT id FROM worker_tasks WHERE id = ANY(%s) ORDER BY id"
                                         " FOR UPDATE NOWAIT", (others,))
                assert [r[0] for r in await cur.fetchall()] == others
            with pytest.raises(psycopg.errors.LockNotAvailable):  # ... and the due one is held by it
                async with conn.transaction():
                    await conn.execute("SELECT id FROM worker_tasks WHERE id = %s FOR UPDATE NOWAIT", (due,))
    finally:
        paused.resume()
    assert await sweep == 1

    after = await tasks_by_id(world.pool)
    assert {t: after[t] for t in others} == {t: before[t] for t in others}
    assert after[due][1] in ("retry_wait", "failed_terminal", "cancelled")
