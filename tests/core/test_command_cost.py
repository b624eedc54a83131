"""The commands on the hot path read a bounded number of rows, however large the queue or the scan.

Acquisition reads a bounded number of index entries however long the queue is, whatever the
planner's statistics say. A queue that filled before the table was ever analysed (a new
deployment, a burst faster than autovacuum, autovacuum off) is exactly when it matters: the
planner then prefers reading and sorting every pending task, which costs milliseconds per
acquire at a few thousand queued tasks and grows with the queue.

Completing a task settles its scan; that reads a summary of the scan's jobs, never each job's
task, so ending one task of a scan of many jobs does not read every other task.

The counts come from the statistics views of the one backend the service used (a pool of one
connection), flushed with ``pg_stat_force_next_flush()``: they are what the service's own
statements read, not an EXPLAIN of a copy of them.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from leasehold.domain.results import payload_sha256
from leasehold.gateway.services import build_services
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database
from support.core import ManualClock, World

QUEUED = 300


async def _counter(pool: AsyncConnectionPool[Any], query: str) -> int:
    async with pool.connection() as conn:
        await conn.execute("SELECT pg_stat_force_next_flush()")  # flushed when the backend goes idle
        cur = await conn.execute(query)
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _acquirable_index_reads(pool: AsyncConnectionPool[Any]) -> int:
    return await _counter(pool, "SELECT idx_tup_read FROM pg_stat_user_indexes"
                                " WHERE indexrelname = 'worker_tasks_org_acquirable_idx'")


async def _task_rows_read(pool: AsyncConnectionPool[Any]) -> int:
    return await _counter(pool, "SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables"
                                " WHERE relname = 'worker_tasks'")


async def _one_connection_world(database_url: str) -> tuple[AsyncConnectionPool[Any], World]:
    pool = create_pool(database_url, min_size=1, max_size=1)
    await pool.open()
    clock = ManualClock()
    services = build_services(Database(pool), clock=clock, rng=random.Random(3))
    org = await services.registry.create_organization("acme")
    scan = await services.scans.create_scan(org, {"targets": ["192.0.2.10"]})
    return pool, World(services, clock, org, scan)


@pytest.mark.parametrize("statistics", ["stale", "fresh"])
async def test_acquire_reads_the_head_of_the_queue_not_all_of_it(database_url: str, statistics: str) -> None:
    pool, world = await _one_connection_world(database_url)
    try:
        worker = await world.worker(capacity=QUEUED)
        first = await world.task()
        for _ in range(QUEUED - 1):
            await world.task()
        async with pool.connection() as conn:
            if statistics == "fresh":
                await conn.execute("ANALYZE worker_tasks")
            cur = await conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'worker_tasks'")
            row = await cur.fetchone()
        assert row is not None
        # The scenario holds: the planner's row estimate predates (or matches) the queue.
        assert (row[0] < QUEUED) if statistics == "stale" else (row[0] >= QUEUED)

        before = await _acquirable_index_reads(pool)
        acquired = await world.lifecycle.acquire(worker)
        second = await world.lifecycle.acquire(worker)
        reads = await _acquirable_index_reads(pool) - before
    finally:
        await pool.close()

    assert acquired is not None and acquired.task.id == first  # oldest first, as the RFC orders
    assert second is not None and second.task.id != first
    # Walking the index in order reads the head entries (the second acquire skips the first's
    # entry); reading and sorting the queue would read all QUEUED entries per acquire.
    assert 1 <= reads <= 10, f"two acquires read {reads} acquirable-index entries of {QUEUED} queued"


async def test_ending_a_task_does_not_read_the_other_tasks_of_its_scan(database_url: str) -> None:
    pool, world = await _one_connection_world(database_url)
    try:
        worker = await world.worker(capacity=QUEUED)
        for _ in range(QUEUED):
            await world.task()  # one scan, QUEUED jobs
        acquired = await world.lifecycle.acquire(worker)
        assert acquired is not None
        task, attempt, token = acquired.task.id, acquired.attempt.id, acquired.lease_token
        records = [{"type": "asset", "kind": "host", "value": "a.example.test"}]
        await world.lifecycle.submit_batch(worker, task, attempt, token, sequence_number=1, idempotency_key="k",
                                           payload_sha256=payload_sha256(records), records=records, final=True)
        before = await _task_rows_read(pool)
        ended = await world.lifecycle.complete(worker, task, attempt, token)
        reads = await _task_rows_read(pool) - before
    finally:
        await pool.close()

    assert ended.state == "completed"
    # The task itself is read a few times (lock, read, write); the scan's other QUEUED - 1 tasks
    # are not read at all.
    assert reads <= 10, f"completing one task read {reads} worker_tasks rows of a {QUEUED}-job scan"
