"""One consistent view of the database for a whole audit run, or for several reads of the
Gateway (:meth:`persistence.transaction.Database.snapshot`).

``REPEATABLE READ`` takes its snapshot at the first statement and keeps it until the end of the
transaction: the event log and the projections read inside it belong to the same moment, so a
command committing meanwhile cannot make a rebuild and the live tables disagree. ``READ ONLY``
makes the intent explicit (and lets PostgreSQL refuse any accidental write).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.pq import TransactionStatus

from leasehold.persistence.rows import execute_named


@asynccontextmanager
async def snapshot(conn: AsyncConnection[Any], *, shared: str | None = None) -> AsyncIterator[AsyncConnection[Any]]:
    """A read-only ``REPEATABLE READ`` transaction on ``conn`` (which must be idle); with
    ``shared``, the very snapshot another transaction exported (:func:`export_snapshot`), so
    several connections (processes) read one moment."""
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise RuntimeError("a snapshot needs an idle connection: commit or roll back its transaction first")
    async with conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        if shared is not None:
            await conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(shared)))
        yield conn


async def export_snapshot(conn: AsyncConnection[Any]) -> str:
    """The id under which other connections can import the snapshot of ``conn``'s transaction
    (valid while that transaction stays open)."""
    cur = await execute_named(conn, "SELECT pg_export_snapshot() AS id")
    row = await cur.fetchone()
    assert row is not None
    return str(row.id)
