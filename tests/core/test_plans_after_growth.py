"""Plans made while the tables were empty stay index-driven after the tables grow.

A new deployment plans (and caches: psycopg prepares a statement on its fifth run, foreign-key
checks keep their plans for the session) every hot-path statement while its tables are empty
and never analysed; if a burst then fills the tables faster than autovacuum analyses them,
those plans must not turn into scans of the whole table. The service's own connection runs a
few lifecycles on an empty database, the tables are then grown by bulk inserts that no ANALYZE
follows, and the same connection's next lifecycles must read the big tables through indexes
only (``pg_stat_user_tables``, flushed from the service's backend).
"""

from __future__ import annotations

import random
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from leasehold.domain.results import payload_sha256
from leasehold.gateway.commands.lifecycle import ResultBatch, TaskSpec
from leasehold.gateway.services import build_services
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database

GROWTH = 20_000
HOT_TABLES = ("worker_tasks", "worker_task_attempts", "scan_jobs", "scans", "worker_result_batches", "events")
RECORDS = [{"type": "asset", "kind": "host", "value": "h"}]


def _grow(database_url: str, org: Any, worker: Any) -> None:
    """GROWTH finished scans, jobs, tasks, attempts, batches and events, in SQL, no ANALYZE."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("""
            WITH s AS (
                INSERT INTO scans (id, organization_id, status, execution_mode, targets, created_at, updated_at,
                                   finished_at, version, head_hash)
                SELECT gen_random_uuid(), %(org)s, 'success', 'gateway', '{}', now(), now(), now(), 2,
                       sha256(g::text::bytea)
                FROM generate_series(1, %(n)s) g RETURNING id)
            INSERT INTO scan_jobs (id, scan_id, organization_id, position, plugin, status, execution_mode,
                                   created_at, updated_at)
            SELECT gen_random_uuid(), s.id, %(org)s, 0, 'grown', 'success', 'gateway', now(), now() FROM s
        """, {"org": org, "n": GROWTH})
        conn.execute("""
            INSERT INTO worker_tasks (id, scan_job_id, scan_id, organization_id, task_type, required_capabilities,
                                      priority, scope, parameters, state, available_at, attempt_count, max_attempts,
                                      lease_seconds, execution_timeout_seconds, created_at, updated_at, finished_at,
                                      version, head_hash)
            SELECT gen_random_uuid(), j.id, j.scan_id, %(org)s, 'grown', '{}', 0, '{}', '{}', 'completed', now(), 1,
                   3, 60, 600, now(), now(), now(), 5, sha256(j.id::text::bytea)
            FROM scan_jobs j WHERE j.plugin = 'grown'
        """, {"org": org})
        conn.execute("""
            INSERT INTO worker_task_attempts (id, task_id, worker_id, attempt_number, lease_token_hash, status,
                                              leased_at, lease_expires_at, deadline_at, finished_at, batch_count,
                                              final_batch_accepted)
            SELECT gen_random_uuid(), t.id, %(worker)s, 1, sha256(t.id::text::bytea), 'succeeded', now(), now(),
                   now(), now(), 1, true
            FROM worker_tasks t WHERE t.task_type = 'grown'
        """, {"worker": worker})
        conn.execute("""
            INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash)
            SELECT t.id, v, 'domain.events:TaskCompleted', '{}', sha256(v::text::bytea), sha256(t.id::text::bytea)
            FROM worker_tasks t, generate_series(1, 3) v WHERE t.task_type = 'grown'
        """)
        # These statements read worker_tasks sequentially themselves. A backend hands its
        # statistics over when idle or at exit, so without this they may land after the test's
        # "before" reading and be counted as the service's own reads.
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")  # the backend was idle in between: flushed


async def _table_reads(pool: AsyncConnectionPool[Any]) -> dict[str, tuple[int, int]]:
    """(rows read by sequential scans, sequential scans) per hot table, as the server counts them."""
    async with pool.connection() as conn:
        await conn.execute("SELECT pg_stat_force_next_flush()")
        cur = await conn.execute("SELECT relname, seq_tup_read, seq_scan FROM pg_stat_user_tables"
                                 " WHERE relname = ANY(%s)", (list(HOT_TABLES),))
        return {name: (read, scans) for name, read, scans in await cur.fetchall()}


async def test_plans_made_on_empty_tables_stay_index_driven_after_growth(database_url: str) -> None:
    pool = create_pool(database_url, min_size=1, max_size=1)  # one backend: its plans are the ones cached
    await pool.open()
    try:
        services = build_services(Database(pool), rng=random.Random(5))
        org = await services.registry.create_organization("acme")
        worker = await services.registry.register_worker(name="w", fingerprint="a" * 64, task_types=("probe",),
                                                        max_concurrent_tasks=10)
        await services.registry.assign_worker(worker, org)

        async def lifecycles(n: int) -> None:
            for _ in range(n):
                scan = await services.scans.create_scan(org, {"targets": ["x"]})
                await services.lifecycle.create_task(scan, TaskSpec(task_type="probe"))
                a = await services.lifecycle.acquire(worker)
                assert a is not None
                await services.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token,
                                                  final_batch=ResultBatch(1, "k", payload_sha256(RECORDS), RECORDS))

        await lifecycles(8)  # every statement planned, prepared and cached on empty tables
        _grow(database_url, org, worker)
        before = await _table_reads(pool)
        await lifecycles(10)
        after = await _table_reads(pool)
    finally:
        await pool.close()
    scanned = {name: after[name][0] - before[name][0] for name in HOT_TABLES}
    assert scanned == dict.fromkeys(HOT_TABLES, 0), scanned
