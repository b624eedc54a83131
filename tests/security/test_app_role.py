"""The application's role cannot rewrite the event log: it may read and append, nothing else.

``leasehold_app`` (created by the migrations, NOLOGIN: granted to the login role the Gateway
uses) holds SELECT and INSERT on ``events``; UPDATE, DELETE and TRUNCATE are refused by
PostgreSQL's privileges, before the append-only triggers (which stop even the table's owner;
``tests/core/test_event_log.py``) are reached. Neither can it step around them: no disabling
the triggers, no replica mode, no dropping the table, no upsert. Every refusal leaves the log
exactly as it was, byte for byte.
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
import pytest

from support.core import World

ROLE = "leasehold_app"


async def built_log(world: World) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    await world.final_batch(worker, a)
    await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)


async def fingerprint(conn: psycopg.AsyncConnection[Any]) -> tuple[int, str]:
    """Row count and a digest of every column of every event."""
    cur = await conn.execute("SELECT notification_id, originator_id, originator_version, topic, state, recorded_at,"
                             " transaction_id::text, prev_hash, hash FROM events ORDER BY notification_id")
    rows = await cur.fetchall()
    return len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()


async def test_the_role_may_read_and_append_only(world: World, database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT p, has_table_privilege(%s, 'events', p) FROM unnest(ARRAY["
            "'SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS p", (ROLE,))
        granted = {p for p, has in await cur.fetchall() if has}
        assert granted == {"SELECT", "INSERT"}
        cur = await conn.execute("SELECT rolsuper, rolbypassrls, rolcanlogin FROM pg_roles WHERE rolname = %s", (ROLE,))
        assert await cur.fetchone() == (False, False, False)
        cur = await conn.execute("SELECT pg_get_userbyid(relowner) <> %s FROM pg_class WHERE relname = 'events'",
                                 (ROLE,))
        assert await cur.fetchone() == (True,)  # not the owner, so it cannot ALTER or DROP it


@pytest.mark.parametrize("statement", [
    "UPDATE events SET topic = 'x'",
    "UPDATE events SET state = state WHERE notification_id = (SELECT max(notification_id) FROM events)",
    "DELETE FROM events",
    "DELETE FROM events WHERE notification_id = (SELECT max(notification_id) FROM events)",
    "TRUNCATE events",
    "TRUNCATE events CASCADE",
    # The partitioned log has no unique index across partitions, so an upsert on it cannot even
    # be planned (InvalidColumnReference); on a partition, where the key is, the role has no right.
    "INSERT INTO events SELECT * FROM events LIMIT 1"
    " ON CONFLICT (originator_id, originator_version) DO UPDATE SET topic = 'x'",
    "INSERT INTO events_p_initial SELECT * FROM events LIMIT 1"
    " ON CONFLICT (originator_id, originator_version) DO UPDATE SET topic = 'x'",
    "ALTER TABLE events DETACH PARTITION events_p_initial",
    "DROP TABLE events_p_initial",
    "ALTER TABLE events DISABLE TRIGGER events_no_update",
    "ALTER TABLE events DISABLE TRIGGER ALL",
    "DROP TABLE events",
    "SET session_replication_role = replica",
    "CREATE OR REPLACE FUNCTION events_reject_change() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$",
])
async def test_the_role_cannot_rewrite_the_log(world: World, database_url: str, statement: str) -> None:
    await built_log(world)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        before = await fingerprint(conn)
        assert before[0] > 0
        await conn.execute(f"SET ROLE {ROLE}")
        cur = await conn.execute("SELECT current_user")
        assert await cur.fetchone() == (ROLE,)
        refused: tuple[type[Exception], ...] = (psycopg.errors.InsufficientPrivilege,)
        if statement.startswith("INSERT INTO events SELECT"):
            refused = (psycopg.errors.InvalidColumnReference,)
        with pytest.raises(refused):
            await conn.execute(statement)
        await conn.execute("RESET ROLE")
        assert await fingerprint(conn) == before


async def test_the_role_can_append(world: World, database_url: str) -> None:
    """The grants are not simply missing: appending works as the role (and is then rolled back)."""
    await built_log(world)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        await conn.execute(f"SET ROLE {ROLE}")
        cur = await conn.execute(
            "INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash)"
            " SELECT gen_random_uuid(), 1, topic, state, prev_hash, hash FROM events LIMIT 1 RETURNING 1")
        assert await cur.fetchone() == (1,)
        await conn.rollback()
