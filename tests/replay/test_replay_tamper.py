"""Tamper evidence (DESIGN §5): with the append-only triggers bypassed by a superuser
(``session_replication_role = replica``), every kind of rewrite of the log is reported by
``replay verify-chain`` — edits, deletions, swaps and insertions by the hash chains, truncated
tails and deleted streams by the checkpoints. One test per kind of tampering."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg
import pytest
from replay_support import cli, cli_json, tamper

from leasehold.persistence.chain import chain_hash
from leasehold.persistence.checkpoints import write_checkpoint
from leasehold.persistence.connection import connect
from support.core import World


async def three_finished_tasks(world: World) -> list[UUID]:
    """Three completed tasks (about 7 events each) in three scans; returns their ids."""
    worker = await world.worker()
    ids = []
    for n in range(3):
        scan = await world.scans.create_scan(world.org, {"targets": [f"10.9.{n}.1"]})
        await world.task(scan=scan)
        a = await world.lifecycle.acquire(worker)
        assert a is not None
        await world.lifecycle.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
        await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
        await world.final_batch(worker, a, [{"type": "asset", "n": n}])
        await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)
        ids.append(a.task.id)
    return ids


async def checkpoint(database_url: str) -> None:
    async with await connect(database_url) as conn:
        await write_checkpoint(conn)


async def verify_chain(database_url: str) -> tuple[int, list[dict[str, Any]]]:
    code, report = await cli_json("replay", "verify-chain", "--database-url", database_url)
    return code, report["problems"]


def stream(url: str, task_id: UUID) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return [(r[0], r[1], bytes(r[2]), bytes(r[3]), bytes(r[4])) for r in conn.execute(
            "SELECT originator_version, topic, state, prev_hash, hash FROM events WHERE originator_id = %s"
            " ORDER BY originator_version", (task_id,))]


@pytest.fixture
async def tasks(world: World, database_url: str) -> list[UUID]:
    ids = await three_finished_tasks(world)
    assert await verify_chain(database_url) == (0, [])
    return ids


async def test_an_edited_payload_breaks_the_chain_at_that_event(tasks: list[UUID], database_url: str) -> None:
    tamper(database_url, ("UPDATE events SET state = convert_to(replace(convert_from(state, 'UTF8'),"
                          " '\"priority\":0', '\"priority\":9'), 'UTF8')"
                          " WHERE originator_id = %s AND originator_version = 1", (tasks[1],)))
    code, problems = await verify_chain(database_url)
    assert code == 1
    assert [(p["stream"], p["version"], p["source"]) for p in problems] == [(str(tasks[1]), 1, "chain")]
    assert "edited" in problems[0]["problem"]


async def test_a_deleted_event_breaks_the_chain_where_it_was(tasks: list[UUID], database_url: str) -> None:
    tamper(database_url, ("DELETE FROM events WHERE originator_id = %s AND originator_version = 3", (tasks[0],)))
    code, problems = await verify_chain(database_url)
    assert code == 1
    assert [(p["stream"], p["version"]) for p in problems] == [(str(tasks[0]), 4)]
    assert "version 4 where 3 was expected" in problems[0]["problem"]


async def test_two_swapped_events_break_the_chain(tasks: list[UUID], database_url: str) -> None:
    events = stream(database_url, tasks[2])
    (v2, topic2, state2, _, _), (v3, topic3, state3, _, _) = events[1], events[2]
    tamper(database_url,
           ("UPDATE events SET topic = %s, state = %s WHERE originator_id = %s AND originator_version = %s",
            (topic3, state3, tasks[2], v2)),
           ("UPDATE events SET topic = %s, state = %s WHERE originator_id = %s AND originator_version = %s",
            (topic2, state2, tasks[2], v3)))
    code, problems = await verify_chain(database_url)
    assert code == 1
    assert [(p["stream"], p["version"]) for p in problems] == [(str(tasks[2]), 2)]


async def test_a_forged_event_inserted_in_the_middle_breaks_the_chain(tasks: list[UUID], database_url: str) -> None:
    events = stream(database_url, tasks[0])
    # Shift v3.. up by one (in two steps, the primary key checks each row), then forge a v3
    # that links correctly to v2: a LeaseRenewed of the attempt, with a correct hash of its own.
    v2_hash = events[1][4]
    forged_state = events[3][2] if "LeaseRenewed" in events[3][1] else events[2][2]
    forged_topic = "domain.events:LeaseRenewed"
    tamper(database_url,
           ("UPDATE events SET originator_version = originator_version + 1000"
            " WHERE originator_id = %s AND originator_version >= 3", (tasks[0],)),
           ("UPDATE events SET originator_version = originator_version - 999"
            " WHERE originator_id = %s AND originator_version > 1000", (tasks[0],)),
           ("INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash)"
            " VALUES (%s, 3, %s, %s, %s, %s)",
            (tasks[0], forged_topic, forged_state, v2_hash,
             chain_hash(v2_hash, tasks[0], 3, forged_topic, forged_state))))
    code, problems = await verify_chain(database_url)
    assert code == 1
    assert [(p["stream"], p["version"]) for p in problems] == [(str(tasks[0]), 4)]
    assert "prev_hash" in problems[0]["problem"] or "edited" in problems[0]["problem"]


async def test_a_stream_rewritten_with_recomputed_hashes_is_caught_by_the_checkpoint(
        tasks: list[UUID], database_url: str) -> None:
    """The insertion above done by someone who also recomputes every later hash: the chain
    verifies again, but the head the checkpoint sealed is no longer in the log."""
    await checkpoint(database_url)
    events = stream(database_url, tasks[0])
    forged = [(v + (v >= 3), topic, state) for v, topic, state, _, _ in events]
    forged.insert(2, (3, events[2][1], events[2][2]))  # a duplicate of v3 as the forged event
    prev = bytes(32)
    rows = []
    for version, topic, state in forged:
        h = chain_hash(prev, tasks[0], version, topic, state)
        rows.append((tasks[0], version, topic, state, prev, h))
        prev = h
    tamper(database_url, ("DELETE FROM events WHERE originator_id = %s", (tasks[0],)),
           *[("INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash)"
              " VALUES (%s, %s, %s, %s, %s, %s)", row) for row in rows])
    code, problems = await verify_chain(database_url)
    assert code == 1
    assert [(p["stream"], p["version"], p["source"]) for p in problems] == [
        (str(tasks[0]), len(events), "checkpoint")]
    assert "hash differs from the sealed one" in problems[0]["problem"]


async def test_a_truncated_tail_is_caught_by_the_checkpoint(tasks: list[UUID], database_url: str) -> None:
    await checkpoint(database_url)
    head = len(stream(database_url, tasks[1]))
    tamper(database_url, ("DELETE FROM events WHERE originator_id = %s AND originator_version > %s",
                          (tasks[1], head - 2)))
    code, problems = await verify_chain(database_url)
    assert code == 1
    assert [(p["stream"], p["version"], p["source"]) for p in problems] == [(str(tasks[1]), head, "checkpoint")]
    assert f"tail truncated: sealed here, but the log ends at v{head - 2}" in problems[0]["problem"]


async def test_a_deleted_stream_is_caught_by_the_checkpoint(tasks: list[UUID], database_url: str) -> None:
    await checkpoint(database_url)
    head = len(stream(database_url, tasks[2]))
    tamper(database_url, ("DELETE FROM events WHERE originator_id = %s", (tasks[2],)))
    code, problems = await verify_chain(database_url)
    assert code == 1
    assert [(p["stream"], p["version"], p["source"]) for p in problems] == [(str(tasks[2]), head, "checkpoint")]
    assert "stream deleted" in problems[0]["problem"]
    code, out, _ = await cli("replay", "verify-chain", "--database-url", database_url)
    assert code == 1 and f"stream {tasks[2]} v{head}: stream deleted" in out and "1 PROBLEM:" in out


async def test_an_edited_or_deleted_checkpoint_breaks_the_seal_chain(tasks: list[UUID], database_url: str) -> None:
    await checkpoint(database_url)
    await checkpoint(database_url)
    await checkpoint(database_url)
    tamper(database_url, "UPDATE checkpoint_heads SET originator_version = originator_version + 1"
                         " WHERE checkpoint_id = 1 AND originator_id = (SELECT min(originator_id::text)::uuid"
                         " FROM checkpoint_heads WHERE checkpoint_id = 1)",
           "DELETE FROM checkpoint_heads WHERE checkpoint_id = 2", "DELETE FROM checkpoints WHERE id = 2")
    code, problems = await verify_chain(database_url)
    assert code == 1
    messages = [p["problem"] for p in problems]
    assert any("seal does not match its heads" in m for m in messages)  # checkpoint 1, edited
    assert any("prev_seal is not the previous checkpoint's seal" in m for m in messages)  # 2 is gone
    assert any("tail truncated" in m for m in messages)  # the edited head claims a version never written


async def test_limit_an_event_forged_at_the_end_after_the_last_checkpoint_is_not_detected(
        tasks: list[UUID], database_url: str) -> None:
    """The documented limit: whoever can write the table as superuser can append an event with a
    correct hash after the last checkpoint. Only a checkpoint seal kept off the machine, compared
    after a later checkpoint, exposes it; ``replay verify`` notices only if the projections were
    left alone."""
    await checkpoint(database_url)
    events = stream(database_url, tasks[0])
    version, topic, state, _, last_hash = events[-1]
    forged_topic, forged_state = events[3][1], events[3][2]
    tamper(database_url, ("INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash)"
                          " VALUES (%s, %s, %s, %s, %s, %s)",
                          (tasks[0], version + 1, forged_topic, forged_state, last_hash,
                           chain_hash(last_hash, tasks[0], version + 1, forged_topic, forged_state))))
    assert await verify_chain(database_url) == (0, [])
    code, report = await cli_json("replay", "verify", "--database-url", database_url)
    assert code == 1 and {d["table"] for d in report["differences"]} >= {"worker_tasks"}


async def test_without_the_bypass_the_checkpoint_tables_are_append_only(tasks: list[UUID], database_url: str) -> None:
    await checkpoint(database_url)
    with psycopg.connect(database_url) as conn:
        for statement in ("UPDATE checkpoints SET head_count = 0", "DELETE FROM checkpoint_heads",
                          "TRUNCATE checkpoints CASCADE"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                conn.execute(statement)
            conn.rollback()


async def test_an_event_that_no_longer_decodes_is_a_clear_error(tasks: list[UUID], database_url: str) -> None:
    tamper(database_url, ("UPDATE events SET state = convert_to('{\"not\": \"an event\"}', 'UTF8')"
                          " WHERE originator_id = %s AND originator_version = 2", (tasks[0],)))
    for command in (("timeline", str(tasks[0])), ("verify",)):
        code, _, err = await cli("replay", *command, "--database-url", database_url)
        assert code == 1 and f"stream {tasks[0]} v2 (domain.events:TaskLeased) does not decode" in err, err
        assert "run: leasehold replay verify-chain" in err and "Traceback" not in err
    code, problems = await verify_chain(database_url)
    assert code == 1 and [(p["stream"], p["version"]) for p in problems] == [(str(tasks[0]), 2)]
