"""The updates of a task's lease-run-complete path write no index entry (HOT updates).

PostgreSQL updates a row in place, with no new entry in any index, only when no column that an
index names (as a key, in an expression or in a partial index's predicate) changes value, and the
row's page has room. Migration 0026 arranged the indexes of ``worker_tasks`` and
``worker_task_attempts`` so that a renewal, the first result batch (leased -> running) and the
completion of a task change none of those columns: an index added later that names ``state``,
``lease_expires_at``, ``last_seen_at`` or another column those commands write makes these updates
cold again, and this test fails (``docs/design/write-ledger.md`` says what each index is for).

The counts are the statistics of the one backend the service used (a pool of one connection),
flushed with ``pg_stat_force_next_flush()`` after each command: what the service's own statements
did, on a scratch database of their own.
"""

from __future__ import annotations

import random
from typing import Any

from psycopg_pool import AsyncConnectionPool

from leasehold.domain.results import payload_sha256
from leasehold.gateway.commands.lifecycle import ResultBatch
from leasehold.gateway.services import build_services
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database
from support.core import ManualClock, World

LIFECYCLES = 12
TABLES = ("worker_tasks", "worker_task_attempts")


async def _updates(pool: AsyncConnectionPool[Any]) -> dict[str, tuple[int, int]]:
    """(rows updated, of which HOT) per table, as the service's backend has flushed them."""
    async with pool.connection() as conn:
        await conn.execute("SELECT pg_stat_force_next_flush()")  # flushed before the server answers
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        cur = await conn.execute("SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                                 " WHERE relname = ANY(%s)", (list(TABLES),))
        return {name: (int(upd), int(hot)) for name, upd, hot in await cur.fetchall()}


def _delta(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    return {t: (after[t][0] - before[t][0], after[t][1] - before[t][1]) for t in TABLES}


async def test_renewal_first_batch_and_completion_are_hot_updates(database_url: str) -> None:
    pool = create_pool(database_url, min_size=1, max_size=1)
    await pool.open()
    try:
        clock = ManualClock()
        services = build_services(Database(pool), clock=clock, rng=random.Random(7))
        org = await services.registry.create_organization("acme")
        world = World(services, clock, org, await services.scans.create_scan(org, {"targets": ["192.0.2.10"]}))
        worker = await world.worker(capacity=LIFECYCLES)
        lifecycle = services.lifecycle
        seen: dict[str, dict[str, tuple[int, int]]] = {c: dict.fromkeys(TABLES, (0, 0))
                                                       for c in ("renew", "first_batch", "complete")}

        def add(command: str, delta: dict[str, tuple[int, int]]) -> None:
            seen[command] = {t: (seen[command][t][0] + delta[t][0], seen[command][t][1] + delta[t][1])
                             for t in TABLES}

        for _ in range(LIFECYCLES):  # queued first: the scan finishes when its last task does
            await world.task()
        for n in range(LIFECYCLES):
            acquired = await lifecycle.acquire(worker)
            assert acquired is not None
            args = (worker, acquired.task.id, acquired.attempt.id, acquired.lease_token)
            mark = await _updates(pool)
            for _ in range(2):
                clock.advance(5)  # a renewal moves lease_expires_at and last_seen_at for real
                await lifecycle.renew(*args)
            after = await _updates(pool)
            add("renew", _delta(mark, after))
            clock.advance(5)
            records: list[Any] = [{"type": "asset", "kind": "host", "value": f"h{n}.example.test"}]
            await lifecycle.submit_batch(*args, sequence_number=1, idempotency_key="first",
                                         payload_sha256=payload_sha256(records), records=records, final=False)
            mark, after = after, await _updates(pool)
            add("first_batch", _delta(mark, after))
            clock.advance(5)
            records = [{"type": "asset", "kind": "host", "value": f"h{n}.b.example.test"}]
            task = await lifecycle.complete(*args, final_batch=ResultBatch(2, "final", payload_sha256(records),
                                                                           records))
            assert task.state == "completed"
            mark, after = after, await _updates(pool)
            add("complete", _delta(mark, after))
    finally:
        await pool.close()

    # Each command updated the rows it should (the counts are live), and its updates were HOT.
    # An index naming a column the command writes makes every one of them cold; a page with no
    # room left makes one cold now and then (its dead versions cannot be pruned while another
    # session's snapshot may still see them: the suite runs in parallel), so three in four are
    # asked, not all.
    def hot(command: str, table: str, updates: int) -> None:
        updated, in_place = seen[command][table]
        assert updated == updates and 4 * in_place >= 3 * updates, seen

    hot("renew", "worker_tasks", 2 * LIFECYCLES)
    hot("renew", "worker_task_attempts", 2 * LIFECYCLES)
    hot("first_batch", "worker_tasks", LIFECYCLES)
    hot("complete", "worker_tasks", LIFECYCLES)
