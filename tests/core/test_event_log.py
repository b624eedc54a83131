"""The event log is append-only in the database itself, and its hash chain exposes edits."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from leasehold.persistence.chain import verify_chains
from leasehold.persistence.connection import connect
from support.core import World


async def _built_log(world: World) -> Any:
    worker = await world.worker()
    a = await world.running(worker)
    await world.final_batch(worker, a)
    await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)
    return a


@pytest.mark.parametrize("statement", [
    "UPDATE events SET topic = 'x'",
    "DELETE FROM events",
    "TRUNCATE events",
])
@pytest.mark.parametrize("role", [None, "leasehold_app"])
async def test_events_reject_update_delete_truncate(world: World, database_url: str, statement: str,
                                                    role: str | None) -> None:
    await _built_log(world)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        if role:
            await conn.execute(f"SET ROLE {role}")
        with pytest.raises((psycopg.errors.InsufficientPrivilege, psycopg.errors.RaiseException)):
            await conn.execute(statement)
        await conn.execute("RESET ROLE")
        cur = await conn.execute("SELECT count(*) FROM events")
        row = await cur.fetchone()
        assert row is not None and row[0] > 0


async def test_intact_chains_verify_clean(world: World, database_url: str) -> None:
    await _built_log(world)
    async with await connect(database_url) as conn:
        assert await verify_chains(conn) == []


async def test_edited_payload_is_detected_by_walking_the_chain(world: World, database_url: str) -> None:
    a = await _built_log(world)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        # A superuser bypassing the triggers rewrites the completed attempt's lease event.
        await conn.execute("SET session_replication_role = replica")
        await conn.execute(
            "UPDATE events SET state = replace(convert_from(state, 'UTF8'), %s, %s)::bytea"
            " WHERE originator_id = %s AND originator_version = 2",
            (str(a.attempt.worker_id), "00000000-0000-0000-0000-000000000000", a.task.id))
    async with await connect(database_url) as conn:
        breaks = await verify_chains(conn)
    assert [(b.originator_id, b.originator_version) for b in breaks] == [(a.task.id, 2)]
    assert "edited" in breaks[0].problem
