"""Checkpoints: sealed incrementally, linear under concurrency, never skipping an event that
commits late, writable by the application role; the seal format is as documented."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime
from typing import Any

import psycopg
from replay_support import cli_json, random_workload

from leasehold.persistence.chain import GENESIS, chain_hash
from leasehold.persistence.checkpoints import verify_checkpoints, write_checkpoint
from leasehold.persistence.connection import connect
from leasehold.persistence.snapshot import snapshot
from leasehold.replay.integrity import verify_log
from support.core import World


async def test_checkpoints_seal_every_stream_then_only_what_changed(world: World, database_url: str) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    async with await connect(database_url) as conn:
        first = await write_checkpoint(conn)
        cur = await conn.execute("SELECT count(DISTINCT originator_id), count(*) FROM events")
        streams, events = await cur.fetchone()  # type: ignore[misc]
        await conn.commit()
        assert (first.head_count, first.changed_count, first.event_count) == (streams, streams, events)
        await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
        second = await write_checkpoint(conn)
        assert (second.head_count, second.changed_count, second.event_count) == (streams, 1, events + 1)
        assert second.prev_seal == first.seal
        third = await write_checkpoint(conn)
        assert (third.changed_count, third.prev_seal) == (0, second.seal)
        await conn.commit()
        # The documented seal format, recomputed by hand for the second checkpoint.
        cur = await conn.execute("SELECT originator_id, originator_version, hash FROM checkpoint_heads"
                                 " WHERE checkpoint_id = %s", (second.id,))
        ((oid, version, h),) = await cur.fetchall()
        micros = (second.created_at - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1_000_000
        expected = hashlib.sha256(b"leasehold checkpoint v1\x00" + first.seal + int(round(micros)).to_bytes(8, "big")
                                  + streams.to_bytes(8, "big") + (events + 1).to_bytes(8, "big")
                                  + oid.bytes + version.to_bytes(8, "big") + bytes(h)).digest()
        assert expected == second.seal
    code, report = await cli_json("replay", "verify-chain", "--database-url", database_url)
    assert code == 0 and report["checkpoints"] == 3 and report["latest_checkpoint"]["seal"] == third.seal.hex()


async def test_concurrent_checkpoints_form_one_chain(world: World, database_url: str) -> None:
    load = asyncio.create_task(random_workload(world, seed=2, rounds=6, settle=False))

    async def one() -> Any:
        async with await connect(database_url) as conn:
            return await write_checkpoint(conn)

    made = []
    while not load.done():
        made += await asyncio.gather(*(one() for _ in range(4)))
    await load
    made.append(await one())
    assert len({c.id for c in made}) == len(made) >= 5
    async with await connect(database_url) as conn:
        async with snapshot(conn):
            checkpoints, problems = await verify_checkpoints(conn)
        assert problems == [] and len(checkpoints) == len(made)
        report = await verify_log(conn)
    assert report.ok
    assert report.latest is not None and report.latest.head_count == report.streams
    assert report.latest.event_count == report.events


async def test_an_event_committed_after_a_checkpoint_by_an_older_transaction_is_sealed_next(
        world: World, database_url: str) -> None:
    """A transaction that started (and got its id) before a checkpoint but commits after it is
    invisible to that checkpoint; the next one must still read it (transaction_xmin window)."""
    worker = await world.worker()
    a = await world.running(worker)
    stream = world.org  # append a second event to the organisation's stream, by hand
    with psycopg.connect(database_url) as late:
        (head, version) = late.execute("SELECT hash, originator_version FROM events WHERE originator_id = %s"
                                       " ORDER BY originator_version DESC LIMIT 1", (stream,)).fetchone()  # type: ignore[misc]
        state = b'{"timestamp":"2030-01-01T00:00:00+00:00","actor":"system","name":"renamed"}'
        topic = "domain.events:OrganizationCreated"
        late.execute("INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash)"
                     " VALUES (%s, %s, %s, %s, %s, %s)",
                     (stream, version + 1, topic, state, bytes(head), chain_hash(bytes(head), stream, version + 1,
                                                                                  topic, state)))
        # Meanwhile newer transactions commit and a checkpoint seals them, not the late one.
        await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
        async with await connect(database_url) as conn:
            before = await write_checkpoint(conn)
        late.commit()
    async with await connect(database_url) as conn:
        after = await write_checkpoint(conn)
        cur = await conn.execute("SELECT originator_version FROM checkpoint_heads WHERE checkpoint_id = %s"
                                 " AND originator_id = %s", (after.id, stream))
        assert await cur.fetchone() == (version + 1,)
        assert after.event_count == before.event_count + 1
    assert GENESIS == bytes(32)


async def test_the_application_role_can_write_checkpoints(world: World, database_url: str) -> None:
    await world.task()
    async with await connect(database_url) as conn:
        await conn.execute("SET ROLE leasehold_app")
        await conn.commit()
        checkpoint = await write_checkpoint(conn)
        assert checkpoint.head_count > 0
        await conn.commit()
        try:
            await conn.execute("DELETE FROM checkpoints")
            raise AssertionError("the application role must not delete checkpoints")
        except psycopg.errors.InsufficientPrivilege:
            await conn.rollback()
    code, report = await cli_json("replay", "checkpoint", "--database-url", database_url)
    assert code == 0 and report["id"] == checkpoint.id + 1 and report["prev_seal"] == checkpoint.seal.hex()
