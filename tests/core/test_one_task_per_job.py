"""RFC "Prevention of dual acquisition": Gateway-created worker_tasks are unique for scan_job_id.

Two guards, each shown on its own: the database refuses a second task on a job (a unique
constraint, so not even the application role can add one), and the service layer never tries —
with that constraint dropped, every way a task is created (an operator's task on a plain scan,
a profile's steps queued as earlier ones end), raced with each other and with cancellations over
many connections, still leaves exactly one task per Gateway job, and no Gateway job without one.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any
from uuid import UUID

import psycopg
import pytest

from leasehold.domain.errors import InvalidTransition, TaskWasCancelled
from leasehold.domain.events import ProfileStep
from leasehold.domain.results import payload_sha256
from leasehold.persistence.roles import APP_ROLE
from support.core import World, assert_log_rebuilds_live, rows

# The unique constraints of worker_tasks on scan_job_id alone (whatever their names).
SCAN_JOB_ID_UNIQUE = """
SELECT c.conname FROM pg_constraint c
WHERE c.conrelid = 'worker_tasks'::regclass AND c.contype = 'u'
  AND c.conkey = ARRAY[(SELECT attnum FROM pg_attribute
                        WHERE attrelid = 'worker_tasks'::regclass AND attname = 'scan_job_id')]
"""
PROFILE = (ProfileStep(task_type="probe"), ProfileStep(task_type="probe", stop_on_failure=False),
           ProfileStep(task_type="probe"))
PROFILE_SCANS = 12
EXTRA_TASKS = 30
PLAIN_SCANS = 3
WORKERS = 8


async def test_the_database_refuses_a_second_task_on_one_job(world: World, database_url: str, pool: Any) -> None:
    task_id = await world.task()
    with psycopg.connect(database_url) as conn:
        conn.execute(f"SET ROLE {APP_ROLE}")  # the Gateway's own privileges: it may insert tasks
        conn.execute("CREATE TEMP TABLE twin AS SELECT * FROM worker_tasks WHERE id = %s", (task_id,))
        conn.execute("UPDATE twin SET id = gen_random_uuid()")  # another task, the same job
        conn.execute("ALTER TABLE twin DROP COLUMN listed_state")  # generated: PostgreSQL computes it
        with pytest.raises(psycopg.errors.UniqueViolation) as refused:
            conn.execute("INSERT INTO worker_tasks SELECT * FROM twin")
        conn.rollback()
        assert refused.value.diag.constraint_name in [r[0] for r in conn.execute(SCAN_JOB_ID_UNIQUE).fetchall()]
    assert await rows(pool, "SELECT id FROM worker_tasks") == [(task_id,)]


async def end_one(world: World, worker: UUID, rng: random.Random) -> bool:
    """The worker leases a task and ends it (most complete, some fail for good); False when it
    found none."""
    lc = world.lifecycle
    a = await lc.acquire(worker)
    if a is None:
        return False
    try:
        await lc.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
        if rng.random() < 0.15:
            await lc.fail(worker, a.task.id, a.attempt.id, a.lease_token, error="boom", retryable=False)
            return True
        records = [{"type": "asset", "kind": "host", "value": f"10.0.{rng.randint(0, 3)}.1"}]
        await lc.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=1,
                              idempotency_key="k", payload_sha256=payload_sha256(records), records=records,
                              final=True)
        await lc.complete(worker, a.task.id, a.attempt.id, a.lease_token)
    except TaskWasCancelled:  # its scan was cancelled meanwhile (the second round races that): stop, as a worker does
        await lc.acknowledge_cancel(worker, a.task.id, a.attempt.id, a.lease_token)
    return True


async def test_the_service_layer_never_puts_a_second_task_on_a_job(world: World, database_url: str,
                                                                  pool: Any) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for (constraint,) in conn.execute(SCAN_JOB_ID_UNIQUE).fetchall():
            conn.execute(f'ALTER TABLE worker_tasks DROP CONSTRAINT "{constraint}"')
        assert conn.execute(SCAN_JOB_ID_UNIQUE).fetchall() == []

    workers = [await world.worker() for _ in range(WORKERS)]
    rng = random.Random(11)
    targets = {"targets": ["127.0.0.1"]}
    profiled = list(await asyncio.gather(*(world.scans.create_scan(world.org, targets, profile=PROFILE)
                                           for _ in range(PROFILE_SCANS))))
    plain = [world.scan, *[await world.scans.create_scan(world.org, targets) for _ in range(PLAIN_SCANS - 1)]]

    async def operator_task(n: int) -> None:
        try:
            await world.task(scan=plain[n % PLAIN_SCANS])
        except InvalidTransition:
            pass  # every task of that scan had ended, and the scan with them

    # Rounds: every worker ends a task at once (profile scans queue their next steps), while
    # operators add tasks to the plain scans (racing for each scan's lock and next position) and,
    # in the second round, cancel a few profile scans (racing their settling).
    extras = list(range(EXTRA_TASKS))
    for round_number in range(100):
        adding, extras = extras[:6], extras[6:]
        cancels = profiled[:3] if round_number == 1 else []
        ended = await asyncio.gather(*(end_one(world, w, random.Random(rng.random())) for w in workers),
                                     *(operator_task(n) for n in adding),
                                     *(world.scans.cancel_scan(scan) for scan in cancels))
        if not adding and not any(ended[:WORKERS]):
            break
    assert await rows(pool, "SELECT count(*) FROM worker_tasks WHERE state NOT IN"
                            " ('completed', 'failed_terminal', 'cancelled')") == [(0,)]
    assert await rows(pool, "SELECT count(*) FROM scans WHERE id = ANY(%s) AND status IN"
                            " ('success', 'failed', 'cancelled')", profiled) == [(PROFILE_SCANS,)]
    assert (await rows(pool, "SELECT count(*) FROM worker_tasks WHERE scan_id = ANY(%s)", plain))[0][0] > PLAIN_SCANS

    assert await rows(pool, "SELECT scan_job_id, count(*) FROM worker_tasks GROUP BY 1 HAVING count(*) > 1") == []
    assert await rows(pool, "SELECT j.id FROM scan_jobs j WHERE j.execution_mode = 'gateway'"
                            " AND NOT EXISTS (SELECT 1 FROM worker_tasks t WHERE t.scan_job_id = j.id)") == []
    await assert_log_rebuilds_live(database_url)
