"""The write buffer against PostgreSQL: split statements do what sequential writes do, queued
writes are sent before anything that could read them, and checks that read another table run
where they see the whole statement. The splitting rules themselves are unit-tested without a
database in tests/unit/test_write_buffer_splitting.py."""

from __future__ import annotations

from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasehold.domain.errors import Conflict, InvalidRequest
from leasehold.persistence.tables import GENERATED_COLUMNS
from leasehold.persistence.task_rows import task_from_row
from leasehold.persistence.transaction import Database, Transaction, one
from leasehold.persistence.writes import WriteBuffer
from leasehold.projections.rows import Insert, Update
from support.core import World


async def _priority(tx: Transaction, task: UUID) -> int:
    row = await tx.one("task_read", {"task_id": task, "now": None})
    assert row is not None
    return task_from_row(row)[0].priority


async def _committed_priority(pool: AsyncConnectionPool, task: UUID) -> int:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT priority FROM worker_tasks WHERE id = %s", (task,))
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_read_sees_the_writes_queued_before_it(world: World, pool: AsyncConnectionPool) -> None:
    task = await world.task()
    async with Database(pool).transaction() as tx:
        tx.apply([Update("worker_tasks", {"id": task}, {"priority": 7})])
        assert await _priority(tx, task) == 7
        tx.apply([Update("worker_tasks", {"id": task}, {"priority": 8})])
        assert await _priority(tx, task) == 8
        tx.apply([Update("worker_tasks", {"id": task}, {"priority": 9})])
        await tx.commit()  # sends the last one first
    assert await _committed_priority(pool, task) == 9


async def test_the_unit_of_work_rolls_back_unless_committed(world: World, pool: AsyncConnectionPool) -> None:
    """Leaving the block without ``commit()`` — a normal exit, an early return, an error — undoes
    everything, the writes already sent included."""
    task = await world.task()
    async with Database(pool).transaction() as tx:
        tx.apply([Update("worker_tasks", {"id": task}, {"priority": 5})])
        assert await _priority(tx, task) == 5  # sent
    with pytest.raises(RuntimeError):
        async with Database(pool).transaction() as tx:
            tx.apply([Update("worker_tasks", {"id": task}, {"priority": 6})])
            raise RuntimeError("the command failed")
    assert await _committed_priority(pool, task) == 0
    async with Database(pool).transaction() as tx:  # the pooled connection is usable again
        tx.apply([Update("worker_tasks", {"id": task}, {"priority": 2})])
        await tx.commit()
    assert await _committed_priority(pool, task) == 2


async def test_reads_sent_together_each_get_their_own_rows(world: World, pool: AsyncConnectionPool) -> None:
    """Writes and every read travel on cursors of their own. psycopg's pipeline may stop fetching
    between two commands, and a cursor with two queued commands would then return the first
    one's rows: a lock read once got the writes' one-column ``SELECT 1`` (a 500 under load)."""
    task = await world.task()
    async with Database(pool).transaction() as tx:
        tx.apply([Update("worker_tasks", {"id": task}, {"priority": 7})])
        locked, row, (now,) = await tx.read(one("task_lock", {"task_id": task}),
                                            one("task_read", {"task_id": task, "now": None}),
                                            one("clock_now", {"now": None}))
        assert locked is not None and locked[0] == task
        assert task_from_row(row)[0].priority == 7
        assert now is not None


async def test_split_writes_do_what_sequential_writes_do(world: World, pool: AsyncConnectionPool) -> None:
    """Both would go wrong in one statement: the guarded update would see the old priority, and
    the new live attempt could be checked against the one-live-attempt index before the old one
    expired."""
    worker = await world.worker()
    leased = await world.leased(worker)
    task, attempt = leased.task.id, leased.attempt.id
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT * FROM worker_task_attempts WHERE id = %s", (attempt,))
        assert cur.description is not None
        row = dict(zip([c.name for c in cur.description], await cur.fetchone() or (), strict=True))
    for generated in GENERATED_COLUMNS["worker_task_attempts"]:  # PostgreSQL computes those
        del row[generated]
    second = {**row, "id": uuid4(), "attempt_number": 2, "acquire_request_id": None}
    ops = [Update("worker_tasks", {"id": task}, {"priority": 1}),
           Update("worker_tasks", {"id": task}, {"priority": 2}, guard=(("priority", (1,)),)),
           Update("worker_task_attempts", {"id": attempt}, {"status": "expired"}),
           Insert("worker_task_attempts", second)]
    writes = WriteBuffer()
    writes.ops(ops)
    # worker_tasks | worker_tasks (the same row) and worker_task_attempts | worker_task_attempts
    assert len(writes) == 3
    async with Database(pool).transaction() as tx:
        tx.apply(ops)
        assert await _priority(tx, task) == 2
        await tx.commit()
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT status FROM worker_task_attempts WHERE task_id = %s ORDER BY attempt_number",
                                 (task,))
        assert [s for (s,) in await cur.fetchall()] == ["expired", "leased"]


async def test_a_rolled_back_savepoint_drops_its_queued_writes(world: World, pool: AsyncConnectionPool) -> None:
    task = await world.task()
    async with Database(pool).transaction() as tx:
        tx.apply([Update("worker_tasks", {"id": task}, {"priority": 4})])
        async with tx.savepoint():  # sends the priority 4 before it starts
            tx.apply([Update("worker_tasks", {"id": task}, {"priority": 5})])
        with pytest.raises(RuntimeError):
            async with tx.savepoint():
                tx.apply([Update("worker_tasks", {"id": task}, {"priority": 6})])
                raise RuntimeError("undo this savepoint")
        assert await _priority(tx, task) == 5
        await tx.commit()
    assert await _committed_priority(pool, task) == 5


async def test_a_combined_statement_maps_errors_as_before(world: World, pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT * FROM organizations WHERE id = %s", (world.org,))
        assert cur.description is not None
        org = dict(zip([c.name for c in cur.description], await cur.fetchone() or (), strict=True))
    task = await world.task()
    ops = [Update("worker_tasks", {"id": task}, {"priority": 3}),
           Insert("organizations", {**org, "id": uuid4()})]  # the same name
    writes = WriteBuffer()
    writes.ops(ops)
    assert len(writes) == 1
    with pytest.raises(Conflict) as raised:
        async with Database(pool).transaction() as tx:
            tx.apply(ops)
            await tx.commit()
    assert raised.value.details["constraint"] == "organizations_name_key"
    assert await _committed_priority(pool, task) == 0


#: Trigger functions that read no table but their own (the log's and the audit tables' refusals,
#: the fixed execution mode), and those that read another one: (table it fires on, table it reads).
SELF_CONTAINED_TRIGGERS = {"events_reject_change", "audit_reject_change", "execution_mode_is_fixed",
                           # raises org_queued_work's flag from the task row's own values; no
                           # combined write holds that table, so nothing it reads can be missing
                           "org_queued_work_mark"}
CROSS_TABLE_TRIGGERS = {"scan_jobs_have_their_scans_mode": ("scan_jobs", "scans"),
                        "worker_tasks_gateway_jobs_only": ("worker_tasks", "scan_jobs")}


async def test_every_trigger_that_reads_another_table_runs_at_commit(database_url: str) -> None:
    """Combined writes put a table and the tables its triggers read in one statement, whose
    sub-statements cannot see each other's rows: a row trigger that reads another table would
    check against rows that are not there yet. So every such trigger must be a constraint
    trigger deferred to COMMIT, and a new trigger must be classified here."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT tgrelid::regclass::text, tgfoid::regproc::text, tgconstraint <> 0,"
                            " tgdeferrable, tginitdeferred FROM pg_trigger WHERE NOT tgisinternal").fetchall()
    unclassified = sorted({fn for _, fn, *_ in rows} - SELF_CONTAINED_TRIGGERS - set(CROSS_TABLE_TRIGGERS))
    assert unclassified == []
    cross = {(table, fn): flags for table, fn, *flags in rows if fn in CROSS_TABLE_TRIGGERS}
    assert set(cross) == {(table, fn) for fn, (table, _) in CROSS_TABLE_TRIGGERS.items()}
    assert all(flags == [True, True, True] for flags in cross.values()), cross


async def test_a_legacy_job_refuses_a_task_written_in_the_same_statement(world: World,
                                                                          pool: AsyncConnectionPool) -> None:
    """The deferred check still refuses, at COMMIT, a task on a legacy job even when the job and
    the task travel in one combined statement."""
    scan = await world.scans.create_scan(world.org, {}, execution_mode="legacy")
    job, task = uuid4(), uuid4()
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT * FROM worker_tasks LIMIT 0")
        assert cur.description is not None
        columns = [c.name for c in cur.description if c.name not in GENERATED_COLUMNS["worker_tasks"]]
        now = (await (await conn.execute("SELECT now()")).fetchone() or (None,))[0]
    ops = [Insert("scan_jobs", {"id": job, "scan_id": scan, "organization_id": world.org, "position": 0,
                                "plugin": "probe", "status": "queued", "execution_mode": "legacy",
                                "created_at": now, "updated_at": now}),
           Insert("worker_tasks", {**dict.fromkeys(columns), "id": task, "scan_job_id": job, "scan_id": scan,
                                   "organization_id": world.org, "task_type": "probe", "required_capabilities": [],
                                   "priority": 0, "scope": {}, "parameters": {}, "state": "pending",
                                   "available_at": now, "attempt_count": 0, "max_attempts": 1, "lease_seconds": 30,
                                   "execution_timeout_seconds": 60, "created_at": now, "updated_at": now,
                                   "version": 1, "head_hash": b"\0" * 32})]
    writes = WriteBuffer()
    writes.ops(ops)
    assert len(writes) == 1
    with pytest.raises(InvalidRequest, match="legacy-executed"):
        async with Database(pool).transaction() as tx:
            tx.apply(ops)
            await tx.commit()
