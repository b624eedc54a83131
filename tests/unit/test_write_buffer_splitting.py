"""The write buffer's pure rules: a command's writes travel as few combined statements, split
where one statement of data-modifying CTEs would not do what the same writes do one after the
other. (That the split statements really do so is shown against PostgreSQL in
tests/core/test_write_buffer.py.)"""

from __future__ import annotations

from uuid import uuid4

import pytest

from leasehold.persistence.writes import WriteBuffer, coalesce, render
from leasehold.projections.rows import Insert, Update, Upsert

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


def test_writes_to_tables_whose_checks_read_each_other_share_a_statement() -> None:
    """A scan, its job and the job's task in one statement: the checks across them (foreign keys,
    the deferred execution-mode triggers) run after it, where they see all of it."""
    writes = WriteBuffer()
    writes.ops([Insert("scans", {"id": 1}), Insert("scan_jobs", {"id": 2, "scan_id": 1}),
                Insert("worker_tasks", {"id": 3, "scan_job_id": 2})])
    assert len(writes) == 1


def test_updates_that_fire_no_trigger_share_a_statement() -> None:
    """An acquire: the task, then its job; neither update touches the column a trigger watches."""
    writes = WriteBuffer()
    writes.ops([Update("worker_tasks", {"id": uuid4()}, {"state": "leased"}),
                Update("scan_jobs", {"id": uuid4()}, {"status": "running"}),
                Update("scans", {"id": uuid4()}, {"status": "running"}, guard=(("status", ("pending",)),))])
    assert len(writes) == 1



def test_events_and_notifications_never_start_a_statement() -> None:
    writes = WriteBuffer()
    writes.events([EVENT])
    writes.ops([Update("worker_tasks", {"id": uuid4()}, {"version": 2})])
    writes.events([EVENT])
    writes.notify("leasehold", "available:x")
    assert len(writes) == 1
    writes.clear()
    assert not writes and len(writes) == 0


def test_a_combined_statement_names_every_write_once_in_order() -> None:
    task = uuid4()
    writes = WriteBuffer()
    writes.events([EVENT])
    writes.ops([Update("worker_tasks", {"id": task}, {"state": "leased"}, guard=(("state", ("pending", "retry_wait")),))])
    writes.notify("leasehold", "available:x")
    (statement,) = writes._statements
    assert statement.compose().as_string(None) == (
        'WITH "w0" AS (INSERT INTO events ("originator_id", "originator_version", "topic", "state", '
        '"prev_hash", "hash") VALUES (%s, %s, %s, %s, %s, %s)), '
        '"w1" AS (UPDATE "worker_tasks" SET "state" = %s WHERE "id" = %s AND "state" = ANY(%s)) '
        "SELECT pg_notify(%s, %s)")
    assert statement.params() == [*EVENT, "leased", task, ["pending", "retry_wait"], "leasehold", "available:x"]


def test_a_named_statement_takes_its_parameters_in_the_order_they_appear() -> None:
    writes = WriteBuffer()
    writes.statement("worker_tasks", "UPDATE worker_tasks SET priority = %(p)s WHERE id = %(id)s",
                     {"id": 7, "p": 3})
    (statement,) = writes._statements
    assert statement.compose().as_string(None) == "UPDATE worker_tasks SET priority = %s WHERE id = %s"
    assert statement.params() == [3, 7]


def test_a_guard_on_null_is_an_is_null_test_without_a_parameter() -> None:
    query, params = render(Update("worker_tasks", {"id": 1}, {"cancel_requested_at": 2},
                                  guard=(("cancel_requested_at", (None,)),)))
    assert query.as_string(None) == (
        'UPDATE "worker_tasks" SET "cancel_requested_at" = %s WHERE "id" = %s AND "cancel_requested_at" IS NULL')
    assert params == [2, 1]


def test_an_upsert_overwrites_only_the_columns_outside_its_key() -> None:
    query, params = render(Upsert("organization_workers", ("organization_id", "worker_id"),
                                  {"organization_id": 1, "worker_id": 2, "enabled": True}))
    assert query.as_string(None).endswith(
        'ON CONFLICT ("organization_id", "worker_id") DO UPDATE SET "enabled" = EXCLUDED."enabled"')
    assert params == [1, 2, True]


def test_coalesce_folds_later_updates_of_a_row_into_its_first_write() -> None:
    task, other = uuid4(), uuid4()
    ops = coalesce([Insert("worker_tasks", {"id": task, "state": "pending", "version": 1}),
                    Update("worker_tasks", {"id": other}, {"version": 5}),
                    Update("worker_tasks", {"id": task}, {"state": "leased", "version": 2})])
    assert ops == [Insert("worker_tasks", {"id": task, "state": "leased", "version": 2}),
                   Update("worker_tasks", {"id": other}, {"version": 5})]
    upsert = Upsert("organization_workers", ("organization_id", "worker_id"),
                    {"organization_id": 1, "worker_id": 2, "enabled": True})
    assert coalesce([upsert, Update("organization_workers", {"organization_id": 1, "worker_id": 2},
                                    {"enabled": False})]) == [
        Upsert("organization_workers", ("organization_id", "worker_id"),
               {"organization_id": 1, "worker_id": 2, "enabled": False})]


def test_coalesce_never_folds_across_a_guarded_update() -> None:
    """A guarded update reads the row as the earlier writes left it, so nothing may move past it."""
    task = uuid4()
    first = Update("worker_tasks", {"id": task}, {"state": "cancelled"})
    guarded = Update("worker_tasks", {"id": task}, {"cancel_requested_at": 1},
                     guard=(("cancel_requested_at", (None,)),))
    after = Update("worker_tasks", {"id": task}, {"version": 9})
    then = Update("worker_tasks", {"id": task}, {"finished_at": 3})
    assert coalesce([first, guarded, after, then]) == [
        first, guarded, Update("worker_tasks", {"id": task}, {"version": 9, "finished_at": 3})]


@pytest.mark.parametrize("count", [1, 3])
def test_every_event_of_a_statement_is_a_row_of_its_one_insert(count: int) -> None:
    writes = WriteBuffer()
    writes.events([EVENT] * count)
    (statement,) = writes._statements
    text = statement.compose().as_string(None)
    assert text.count("INSERT INTO events") == 1 and text.count("(%s, %s, %s, %s, %s, %s)") == count
    assert statement.params() == list(EVENT) * count
