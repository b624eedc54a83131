"""``replay verify``: a rebuild of the log equals the live projections after a randomised concurrent
run, reports exactly the row someone edited, and never raises a false alarm under load."""

from __future__ import annotations

import asyncio
from typing import Any

from replay_support import cli, cli_json, random_workload

from leasehold.persistence.codec import MAPPER, decode_event
from leasehold.persistence.connection import connect
from leasehold.persistence.snapshot import snapshot
from leasehold.persistence.tables import load_tables
from leasehold.projections.compare import diff
from leasehold.replay.fold import fold
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
            inside = await load_tables(conn)
        assert diff(inside, folded.tables.tables) == []
        assert diff(await load_tables(outside), folded.tables.tables) != []


async def test_every_stored_event_decodes_and_encodes_back_to_its_stored_bytes(
        world: World, database_url: str) -> None:
    """The one serialization path round-trips: what a rebuild decodes is exactly what was hashed."""
    await random_workload(world, seed=3, rounds=6)
    async with await connect(database_url) as conn:
        cur = await conn.execute("SELECT originator_id, originator_version, topic, state FROM events")
        rows = await cur.fetchall()
    assert len({topic for _, _, topic, _ in rows}) >= 10
    for oid, version, topic, state in rows:
        stored = MAPPER.to_stored_event(decode_event(oid, version, topic, bytes(state)))
        assert (stored.originator_id, stored.originator_version, stored.topic, stored.state) == (
            oid, version, topic, bytes(state))


async def test_the_fold_reads_the_log_in_batches_and_counts_every_event(world: World, database_url: str) -> None:
    await random_workload(world, seed=3, rounds=6)
    async with await connect(database_url) as conn, snapshot(conn):
        whole = await fold(conn, batch_size=1_000_000)
        seen: list[int] = []
        batched = await fold(conn, batch_size=37, progress=seen.append)  # several batches, prefetching across them
        live = await load_tables(conn)
        cur = await conn.execute("SELECT count(*) FROM events")
        count = await cur.fetchone()
    assert count is not None and batched.events == whole.events == count[0] > 37 * 3
    assert seen == [*range(37, count[0], 37), count[0]]
    assert batched.tables.tables == whole.tables.tables
    assert diff(live, batched.tables.tables) == []


async def test_diff_words_and_orders_every_kind_of_difference(world: World, database_url: str) -> None:
    await random_workload(world, seed=4, rounds=6)
    async with await connect(database_url) as conn, snapshot(conn):
        live = await load_tables(conn)
        rebuilt = (await fold(conn)).tables.tables
    assert diff(live, rebuilt) == []
    edited = {table: {key: dict(row) for key, row in rows.items()} for table, rows in rebuilt.items()}
    tasks = list(edited["worker_tasks"])[:3]
    edited["worker_tasks"][tasks[0]]["priority"] = 99
    edited["worker_tasks"][tasks[1]]["required_capabilities"] = ("x",)
    edited["worker_tasks"][tasks[2]]["scope"] = {"tampered": True}
    attempt = next(iter(edited["worker_task_attempts"]))
    del edited["worker_task_attempts"][attempt]
    edited["scans"][("extra",)] = {"id": "extra"}
    org = next(iter(edited["organizations"]))
    edited["organizations"][org]["head_hash"] = b"x"
    # The same values in another container (a tuple rebuilt, a list read) are no difference.
    worker = next(iter(edited["workers"]))
    edited["workers"][worker]["capabilities"] = tuple(live["workers"][worker]["capabilities"])
    changed = {tasks[0]: f"priority: live={live['worker_tasks'][tasks[0]]['priority']!r} rebuilt=99",
               tasks[1]: "required_capabilities: live="
                         f"{live['worker_tasks'][tasks[1]]['required_capabilities']!r} rebuilt=('x',)",
               tasks[2]: f"scope: live={live['worker_tasks'][tasks[2]]['scope']!r} rebuilt={{'tampered': True}}"}
    assert [str(d) for d in diff(live, edited)] == [
        f"organizations[{org[0]}]: head_hash: live={live['organizations'][org]['head_hash']!r} rebuilt=b'x'",
        "scans[extra]: missing live",
        *(f"worker_tasks[{key[0]}]: {changed[key]}" for key in sorted(tasks, key=repr)),
        f"worker_task_attempts[{attempt[0]}]: missing rebuilt",
    ]
    assert [d.kind for d in diff(live, edited)] == ["changed", "missing_live", "changed", "changed", "changed",
                                                   "missing_rebuilt"]
