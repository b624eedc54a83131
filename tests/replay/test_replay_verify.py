"""``replay verify``: a rebuild of the log equals the live projections after a randomised concurrent
run, reports exactly the row someone edited, and never raises a false alarm under load."""

from __future__ import annotations

import asyncio
from typing import Any

from eventsourcing.persistence import StoredEvent
from replay_support import cli, cli_json, random_workload

from persistence.codec import MAPPER
from persistence.connection import connect
from projections.rebuild import diff, fold_log, load_live
from replay import compare
from replay.decode import DECODE
from replay.fold import fold
from replay.snapshot import snapshot
from support.core import World

LIFECYCLE_EVENTS = {"TaskLeased", "TaskStarted", "LeaseRenewed", "ResultBatchAccepted", "TaskCompleted",
                    "AttemptFailed", "LeaseExpired", "CancelRequested", "TaskCancelled", "WriteRejected"}


async def event_types(database_url: str) -> set[str]:
    async with await connect(database_url) as conn:
        cur = await conn.execute("SELECT DISTINCT split_part(topic, ':', 2) FROM events")
        return {r[0] for r in await cur.fetchall()}


async def test_verify_after_a_randomised_run_then_reports_exactly_the_edited_row(
        world: World, pool: Any, database_url: str) -> None:
    run = await random_workload(world, seed=11)
    # The run went through the whole lifecycle, refusals included (else this proves little).
    assert len(LIFECYCLE_EVENTS - await event_types(database_url)) <= 1, run
    assert sum(run.refused.values()) > 0

    code, report = await cli_json("replay", "verify", "--database-url", database_url)
    assert (code, report["ok"], report["differences"]) == (0, True, [])
    assert report["events"] > 200 and report["rows"]["worker_task_attempts"] > 25

    async with pool.connection() as conn:
        cur = await conn.execute("UPDATE worker_task_attempts SET error = 'edited by hand'"
                                 " WHERE id = (SELECT min(id::text)::uuid FROM worker_task_attempts) RETURNING id")
        edited = await cur.fetchone()
    assert edited is not None
    code, report = await cli_json("replay", "verify", "--database-url", database_url)
    assert code == 1 and report["ok"] is False
    assert [(d["table"], d["key"], d["kind"], list(d["columns"])) for d in report["differences"]] == [
        ("worker_task_attempts", [str(edited[0])], "changed", ["error"])]
    assert report["differences"][0]["columns"]["error"][0] == "edited by hand"

    code, out, _ = await cli("replay", "verify", "--database-url", database_url)
    assert code == 1
    assert f"worker_task_attempts[{edited[0]}]: error: live='edited by hand'" in out
    assert "1 DIFFERENCE:" in out


async def test_verify_never_reports_a_difference_while_the_gateway_is_under_load(
        world: World, database_url: str) -> None:
    load = asyncio.create_task(random_workload(world, seed=5, rounds=25, settle=False))
    seen: list[tuple[int, list[Any], int]] = []
    while (not load.done() or len(seen) < 3) and len(seen) < 12:
        code, report = await cli_json("replay", "verify", "--database-url", database_url, "--no-progress")
        seen.append((code, report["differences"], report["events"]))
    await load
    code, report = await cli_json("replay", "verify", "--database-url", database_url)
    seen.append((code, report["differences"], report["events"]))
    assert [(c, d) for c, d, _ in seen] == [(0, [])] * len(seen)
    assert len({events for _, _, events in seen}) >= 3, "verify should have run while the log was growing"


async def test_the_snapshot_is_what_keeps_verify_honest(world: World, database_url: str) -> None:
    """Fold, let a command commit, then read the live tables: inside the snapshot both sides
    agree; read the live tables outside it and the same moment shows a (false) difference."""
    worker = await world.worker()
    a = await world.running(worker)
    async with await connect(database_url) as conn, await connect(database_url) as outside:
        async with snapshot(conn):
            folded = await fold(conn)
            await world.final_batch(worker, a)  # commits events and projection rows meanwhile
            inside = await load_live(conn)
        assert diff(inside, folded.tables.tables) == []
        assert diff(await load_live(outside), folded.tables.tables) != []


async def test_replay_decoder_and_tables_equal_the_shared_mapper_and_fold(world: World, database_url: str) -> None:
    await random_workload(world, seed=3, rounds=6)
    async with await connect(database_url) as conn:
        cur = await conn.execute("SELECT originator_id, originator_version, topic, state FROM events")
        rows = await cur.fetchall()
        for oid, version, topic, state in rows:
            fast = DECODE(oid, version, topic, bytes(state))
            slow = MAPPER.to_domain_event(StoredEvent(originator_id=oid, originator_version=version, topic=topic,
                                                      state=bytes(state)))
            assert fast == slow and type(fast) is type(slow)
        await conn.commit()
        async with snapshot(conn):
            ours = await fold(conn, batch_size=37)  # several batches, prefetching across them
            shared = await fold_log(conn)
    assert ours.events == len(rows)
    assert ours.tables.tables == shared.tables


async def test_replay_load_live_and_diff_equal_the_shared_ones(world: World, database_url: str) -> None:
    await random_workload(world, seed=4, rounds=6)
    async with await connect(database_url) as conn, snapshot(conn):
        fast_live, shared_live = await compare.load_live(conn), await load_live(conn)
        rebuilt = (await fold(conn)).tables.tables
    assert fast_live == shared_live
    assert compare.diff(fast_live, rebuilt) == diff(shared_live, rebuilt) == []
    # Now make every kind of difference and check both report the same, in the same order.
    edited = {table: {key: dict(row) for key, row in rows.items()} for table, rows in rebuilt.items()}
    tasks = list(edited["worker_tasks"])
    edited["worker_tasks"][tasks[0]]["priority"] = 99
    edited["worker_tasks"][tasks[1]]["required_capabilities"] = ("x",)
    edited["worker_tasks"][tasks[2]]["scope"] = {"tampered": True}
    del edited["worker_task_attempts"][next(iter(edited["worker_task_attempts"]))]
    edited["scans"][("extra",)] = {"id": "extra"}
    edited["organizations"][next(iter(edited["organizations"]))]["head_hash"] = b"x"
    # Same values in another type (tuple vs list) are not a difference for either.
    edited["workers"][next(iter(edited["workers"]))]["capabilities"] = tuple(
        next(iter(rebuilt["workers"].values()))["capabilities"])
    expected = diff(shared_live, edited)
    assert len(expected) == 6
    assert compare.diff(fast_live, edited) == expected
