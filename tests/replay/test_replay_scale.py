"""Replay at scale: the log folded stream group by stream group in bounded chunks, in several
processes sharing one snapshot, and verified incrementally from a checkpoint; the same rows as
folding the whole log at once, the same differences found."""

from __future__ import annotations

import io
from contextlib import redirect_stderr
from typing import Any
from uuid import UUID

import pytest
from replay_support import cli, cli_json, random_workload, tamper

from leasehold.persistence.connection import connect
from leasehold.persistence.event_log import group_batches
from leasehold.persistence.snapshot import snapshot
from leasehold.persistence.tables import GROUP_OF, load_tables
from leasehold.replay import render
from leasehold.replay.fold import fold, fold_groups
from leasehold.replay.parallel import FIRST, uuid_ranges, verify_range
from support.core import World


async def test_chunks_of_groups_hold_complete_groups_and_add_up_to_the_whole_fold(
        world: World, database_url: str) -> None:
    """The memory bound: each chunk holds its own groups' rows only (all rows of a group before
    its bound), a chunk closes soon after ``chunk_events``, and the chunks together are the
    whole-log fold."""
    await random_workload(world, seed=21, rounds=6)
    async with await connect(database_url) as conn, snapshot(conn):
        whole = (await fold(conn)).tables.tables
        groups: dict[UUID, int] = {}
        async for batch in group_batches(conn, FIRST, None):
            for row in batch:
                groups[row[5]] = groups.get(row[5], 0) + 1
        chunks = [c async for c in fold_groups(group_batches(conn, FIRST, None, batch_size=7), chunk_events=10)]
    largest = max(groups.values())
    assert len(chunks) >= 5 and sum(c.events for c in chunks) == sum(groups.values())
    assert all(c.events < 10 + largest + 7 for c in chunks)
    merged: dict[str, dict[Any, Any]] = {table: {} for table in whole}
    previous = FIRST
    for chunk in chunks:
        for table, rows in chunk.tables.items():
            for key, row in rows.items():
                assert key not in merged[table]
                merged[table][key] = row
                group = _group_of(table, row, whole)
                assert previous <= group and (chunk.bound is None or group < chunk.bound), (table, key)
        previous = chunk.bound or previous
    assert merged == whole


def _group_of(table: str, row: dict[str, Any], whole: dict[str, dict[Any, Any]]) -> UUID:
    column = GROUP_OF[table]
    if column.startswith("t."):
        return whole["worker_tasks"][(row["task_id"],)]["scan_id"]  # type: ignore[no-any-return]
    return row[column.removeprefix("x.")]  # type: ignore[no-any-return]


async def test_small_chunks_and_ranges_find_exactly_the_edited_rows(world: World, database_url: str) -> None:
    """A task whose scan_id was edited is filed under another group on the live side: it is
    still one changed row, not a missing one and an extra one."""
    run = await random_workload(world, seed=22, rounds=6)
    task, attempt_owner = run.tasks[0], run.tasks[1]
    tamper(database_url,
           ("UPDATE worker_tasks SET scan_id = %s WHERE id = %s", (UUID(int=1), task)),
           ("UPDATE worker_task_attempts SET error = 'edited' WHERE task_id = %s AND attempt_number = 1",
            (attempt_owner,)))
    async with await connect(database_url) as conn, snapshot(conn):
        part = None
        for lo, hi in uuid_ranges(3):
            found = await verify_range(conn, "public", lo, hi, chunk_events=25)
            if part is None:
                part = found
            else:
                part.merge(found)
        assert part is not None
        live = await load_tables(conn)
    differences = part.comparison.differences()
    assert [(d.table, d.key, d.kind, sorted(d.columns)) for d in differences] == [
        ("worker_tasks", (task,), "changed", ["scan_id"]),
        *([("worker_task_attempts", a, "changed", ["error"]) for a, row in live["worker_task_attempts"].items()
           if row["task_id"] == attempt_owner and row["attempt_number"] == 1]),
    ]
    assert part.rows == {table: len(rows) for table, rows in live.items()}


async def test_parallel_verify_and_rebuild_equal_the_live_projections(world: World, database_url: str) -> None:
    await random_workload(world, seed=23, rounds=6)
    url = ("--database-url", database_url)
    code, report = await cli_json("replay", "rebuild", "--schema", "parallel_copy", "--jobs", "2", *url)
    assert code == 0 and report["events"] > 100
    code, serial = await cli_json("replay", "verify", "--jobs", "1", *url)
    code2, parallel = await cli_json("replay", "verify", "--schema", "parallel_copy", "--jobs", "2", *url)
    assert (code, code2, serial["ok"], parallel["ok"]) == (0, 0, True, True)
    assert parallel["rows"] == serial["rows"] == report["rows"] and parallel["events"] == serial["events"]
    async with await connect(database_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE '\\_rebuild\\_%'")
        assert await cur.fetchone() == (0,)  # the staging schema became parallel_copy
    async with await connect(database_url) as conn:
        cur = await conn.execute("UPDATE parallel_copy.scan_jobs SET id = %s"
                                 " WHERE id = (SELECT min(id::text)::uuid FROM parallel_copy.scan_jobs) RETURNING id",
                                 (UUID(int=7),))
        assert await cur.fetchone() is not None
    code, report = await cli_json("replay", "verify", "--schema", "parallel_copy", "--jobs", "2", *url)
    assert code == 1 and [(d["table"], d["kind"]) for d in report["differences"]] == [
        ("scan_jobs", "missing_rebuilt"), ("scan_jobs", "missing_live")]
    assert report["differences"][0]["key"] == [str(UUID(int=7))]


async def test_verify_since_a_checkpoint_refolds_only_the_groups_touched_after_it(
        world: World, database_url: str) -> None:
    url = ("--database-url", database_url)
    async with await connect(database_url) as blocker, blocker.transaction(force_rollback=True):
        # A transaction older than every event below, still open at the checkpoint: its
        # transaction_xmin then lets every event through, and the sealed heads must sort them.
        cur = await blocker.execute("SELECT pg_current_xact_id()::text::bigint")
        held = await cur.fetchone()
        await random_workload(world, seed=24, rounds=4)
        code, cp = await cli_json("replay", "checkpoint", *url)
        assert code == 0
        cur = await blocker.execute("SELECT transaction_xmin::text::bigint FROM checkpoints WHERE id = %s",
                                    (cp["id"],))
        # At most ours: the horizon is the server's, and another test's transaction may be older.
        xmin = await cur.fetchone()
        assert held is not None and xmin is not None and xmin[0] <= held[0]
    scan = await world.scans.create_scan(world.org, {"targets": ["10.9.0.0/24"]})
    fresh = await world.task(scan=scan)
    code, full = await cli_json("replay", "verify", *url)
    assert code == 0 and full["latest_checkpoint"]["seal"] == cp["seal"]
    for since in (str(cp["id"]), cp["seal"], full["latest_checkpoint"]["created_at"]):
        code, report = await cli_json("replay", "verify", "--since", since, *url)
        assert (code, report["ok"], report["since"]["id"]) == (0, True, cp["id"])
        assert 0 < report["events"] < full["events"] / 5  # the new scan's group (and the org's), not the log
        assert report["rows"]["worker_tasks"] == 1
    # An edit to a touched group is found; an edit to an old, untouched one is left to a full verify.
    async with await connect(database_url) as conn:
        cur = await conn.execute("SELECT id FROM worker_tasks WHERE scan_id <> %s LIMIT 1", (scan,))
        old = await cur.fetchone()
    assert old is not None
    tamper(database_url, ("UPDATE worker_tasks SET priority = 77 WHERE id = ANY(%s)", ([fresh, old[0]],)))
    code, report = await cli_json("replay", "verify", "--since", cp["seal"], *url)
    assert code == 1 and [d["key"] for d in report["differences"]] == [[str(fresh)]]
    code, report = await cli_json("replay", "verify", *url)
    assert code == 1 and sorted(d["key"][0] for d in report["differences"]) == sorted([str(fresh), str(old[0])])


async def test_verify_since_refuses_what_names_no_checkpoint(world: World, database_url: str) -> None:
    url = ("--database-url", database_url)
    code, _, err = await cli("replay", "verify", "--since", "42", *url)
    assert code == 1 and "no checkpoint matches --since 42" in err
    code, _, err = await cli("replay", "verify", "--since", "yesterday", *url)
    assert code == 2 and "not a checkpoint id, seal or ISO 8601 time" in err
    code, _, err = await cli("replay", "verify", "--jobs", "0", *url)
    assert code == 2 and "must be at least 1" in err


async def test_a_stream_whose_first_event_is_gone_is_a_clear_error(world: World, database_url: str) -> None:
    run = await random_workload(world, seed=25, rounds=2)
    async with await connect(database_url) as conn:
        cur = await conn.execute("SELECT originator_id FROM events WHERE originator_id = ANY(%s)"
                                 " AND originator_version = 2 LIMIT 1", (run.tasks,))
        task = await cur.fetchone()
    assert task is not None
    tamper(database_url, ("DELETE FROM events WHERE originator_id = %s AND originator_version = 1", task))
    for command in (("verify",), ("rebuild", "--schema", "after_delete")):
        code, _, err = await cli("replay", *command, "--database-url", database_url)
        assert code == 1 and "belong to streams whose first event is missing" in err, err
        assert "run: leasehold replay verify-chain" in err and "Traceback" not in err


@pytest.mark.parametrize("total", [1000, None])
def test_progress_lines_without_a_terminal_give_the_rate_and_an_eta(monkeypatch: pytest.MonkeyPatch,
                                                                     total: int | None) -> None:
    monkeypatch.setattr(render, "PROGRESS_LINE_SECONDS", 0.0)
    err = io.StringIO()
    with redirect_stderr(err), render.progress_bar("verify", total, True) as update:
        update(250)
    line = err.getvalue()
    assert line.startswith("verify: 250 events, ") and " events/s" in line
    assert ("left (of ~1,000)" in line) == (total is not None)
    err = io.StringIO()
    with redirect_stderr(err), render.progress_bar("verify", total, False) as update:
        update(250)
    assert err.getvalue() == ""
