"""The write buffer: a command's writes travel as few combined statements, split where one
statement of data-modifying CTEs would not do what the same writes do one after the other, and
sent before anything that could read them."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from domain.errors import Conflict
from persistence.transaction import transaction
from persistence.writes import TRIGGER_READS, BufferedCursor, WriteBuffer, apply
from projections.rows import Insert, Update
from support.core import World

EVENT = (uuid4(), 1, "topic", b"{}", b"\0" * 32, b"\1" * 32)


def test_writes_to_different_tables_share_one_statement() -> None:
    """The shape of a worker write: events, the task, its attempt, a batch and a notification."""
    writes = WriteBuffer()
    task, attempt = uuid4(), uuid4()
    writes.events([EVENT, EVENT])
    writes.ops([Update("worker_tasks", {"id": task}, {"version": 3}),
                Update("worker_task_attempts", {"id": attempt}, {"batch_count": 1}),
                Insert("worker_result_batches", {"id": uuid4(), "attempt_id": attempt})])
    writes.notify("leasehold", "available:x")
    assert len(writes) == 1


def test_the_same_row_twice_takes_two_statements() -> None:
    writes = WriteBuffer()
    task = uuid4()
    writes.ops([Update("worker_tasks", {"id": task}, {"state": "cancelled"}),
                Update("worker_tasks", {"id": task}, {"cancel_requested_at": 1},
                       guard=(("cancel_requested_at", (None,)),))])
    assert len(writes) == 2


def test_one_table_twice_takes_two_statements() -> None:
    writes = WriteBuffer()
    writes.ops([Update("worker_task_attempts", {"id": uuid4()}, {"status": "expired"}),
                Insert("worker_task_attempts", {"id": uuid4(), "status": "leased"})])
    assert len(writes) == 2


@pytest.mark.parametrize(("first", "second"), [
    ("scans", "scan_jobs"), ("scan_jobs", "worker_tasks"), ("worker_tasks", "scan_jobs"), ("scan_jobs", "scans")])
def test_tables_whose_trigger_reads_the_other_are_inserted_apart(first: str, second: str) -> None:
    writes = WriteBuffer()
    writes.ops([Insert(first, {"id": uuid4()}), Insert(second, {"id": uuid4()})])
    assert len(writes) == 2


def test_updates_that_fire_no_trigger_share_a_statement() -> None:
    """An acquire: the task, then its job; neither update touches the column a trigger watches."""
    writes = WriteBuffer()
    writes.ops([Update("worker_tasks", {"id": uuid4()}, {"state": "leased"}),
                Update("scan_jobs", {"id": uuid4()}, {"status": "running"}),
                Update("scans", {"id": uuid4()}, {"status": "running"}, guard=(("status", ("pending",)),))])
    assert len(writes) == 1


async def _priority(cur: Any, task: UUID) -> int:
    await cur.execute("SELECT priority FROM worker_tasks WHERE id = %s", (task,))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_read_sees_the_writes_queued_before_it(world: World, pool: AsyncConnectionPool) -> None:
    task = await world.task()
    async with transaction(pool) as cur:
        assert isinstance(cur, BufferedCursor)
        await apply(cur, [Update("worker_tasks", {"id": task}, {"priority": 7})])
        assert len(cur.writes) == 1
        async with cur.connection.cursor() as other:  # another cursor of the transaction
            assert await _priority(other, task) == 7
        assert not cur.writes
        await apply(cur, [Update("worker_tasks", {"id": task}, {"priority": 8})])
        assert await _priority(cur, task) == 8
        await apply(cur, [Update("worker_tasks", {"id": task}, {"priority": 9})])
    async with pool.connection() as conn:  # COMMIT sent the last one
        assert await _priority(conn.cursor(), task) == 9


async def test_the_reading_cursor_waits_for_its_own_statement_only(world: World, pool: AsyncConnectionPool) -> None:
    """The writes sent before a read travel on a cursor of their own. psycopg's pipeline may stop
    fetching between two commands, and a cursor with two queued commands would then return the
    first one's rows: a lock read got the writes' one-column ``SELECT 1`` (a 500 under load)."""
    task = await world.task()
    async with transaction(pool) as cur:
        async with cur.connection.cursor() as lock_cur:  # the pattern of every lock-then-read
            await apply(cur, [Update("worker_tasks", {"id": task}, {"priority": 7})])
            await lock_cur.execute("SELECT id, priority FROM worker_tasks WHERE id = %s FOR UPDATE", (task,))
            await cur.execute("SELECT 1, 2, 3")
            queued = [entry[0] for entry in cur.connection._pipeline.result_queue if entry is not None]
            assert queued.count(lock_cur) == 1 and queued.count(cur) == 1
            assert await lock_cur.fetchone() == (task, 7)
        assert await cur.fetchone() == (1, 2, 3)


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
    second = {**row, "id": uuid4(), "attempt_number": 2, "acquire_request_id": None}
    async with transaction(pool) as cur:
        await apply(cur, [
            Update("worker_tasks", {"id": task}, {"priority": 1}),
            Update("worker_tasks", {"id": task}, {"priority": 2}, guard=(("priority", (1,)),)),
            Update("worker_task_attempts", {"id": attempt}, {"status": "expired"}),
            Insert("worker_task_attempts", second),
        ])
        assert isinstance(cur, BufferedCursor)
        queued = len(cur.writes)
        assert await _priority(cur, task) == 2
        await cur.execute("SELECT status FROM worker_task_attempts WHERE task_id = %s ORDER BY attempt_number",
                          (task,))
        assert [s for (s,) in await cur.fetchall()] == ["expired", "leased"]
    # worker_tasks | worker_tasks (the same row) and worker_task_attempts | worker_task_attempts
    assert queued == 3


async def test_a_rolled_back_savepoint_drops_its_queued_writes(world: World, pool: AsyncConnectionPool) -> None:
    task = await world.task()
    async with transaction(pool) as cur:
        await apply(cur, [Update("worker_tasks", {"id": task}, {"priority": 4})])
        async with cur.connection.transaction():  # sends the priority 4 before it starts
            await apply(cur, [Update("worker_tasks", {"id": task}, {"priority": 5})])
        with pytest.raises(RuntimeError):
            async with cur.connection.transaction():
                await apply(cur, [Update("worker_tasks", {"id": task}, {"priority": 6})])
                raise RuntimeError("undo this savepoint")
        assert not cur.writes
        assert await _priority(cur, task) == 5


async def test_a_combined_statement_maps_errors_as_before(world: World, pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT * FROM organizations WHERE id = %s", (world.org,))
        assert cur.description is not None
        org = dict(zip([c.name for c in cur.description], await cur.fetchone() or (), strict=True))
    task = await world.task()
    with pytest.raises(Conflict) as raised:
        async with transaction(pool) as cur:
            await apply(cur, [Update("worker_tasks", {"id": task}, {"priority": 3}),
                              Insert("organizations", {**org, "id": uuid4()})])  # the same name
            assert len(cur.writes) == 1
    assert raised.value.details["constraint"] == "organizations_name_key"
    async with pool.connection() as conn:
        assert await _priority(conn.cursor(), task) == 0


#: Trigger functions that read no table but their own (the log's and the audit tables' refusals,
#: the fixed execution mode), and those that read another one: (table it fires on, table it reads).
SELF_CONTAINED_TRIGGERS = {"events_reject_change", "audit_reject_change", "execution_mode_is_fixed"}
CROSS_TABLE_TRIGGERS = {"scan_jobs_have_their_scans_mode": ("scan_jobs", "scans"),
                        "worker_tasks_gateway_jobs_only": ("worker_tasks", "scan_jobs")}


async def test_every_trigger_that_reads_another_table_is_known_to_the_buffer(database_url: str) -> None:
    """The buffer keeps a trigger and the table it reads out of one statement only if it knows the
    pair (``TRIGGER_READS``). A new trigger must be classified above, and a cross-table one declared
    there too, or combined writes could skip its check without a word."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT tgrelid::regclass::text, tgfoid::regproc::text FROM pg_trigger"
                            " WHERE NOT tgisinternal").fetchall()
    unclassified = sorted({fn for _, fn in rows} - SELF_CONTAINED_TRIGGERS - set(CROSS_TABLE_TRIGGERS))
    assert unclassified == []
    assert {(table, fn) for table, fn in rows if fn in CROSS_TABLE_TRIGGERS} == \
        {(table, fn) for fn, (table, _) in CROSS_TABLE_TRIGGERS.items()}
    assert set(CROSS_TABLE_TRIGGERS.values()) <= {(fires, reads) for fires, _, reads in TRIGGER_READS}
