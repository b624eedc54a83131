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

from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus


@asynccontextmanager
async def snapshot(conn: AsyncConnection[Any]) -> AsyncIterator[AsyncConnection[Any]]:
    """A read-only ``REPEATABLE READ`` transaction on ``conn`` (which must be idle)."""
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise RuntimeError("a snapshot needs an idle connection: commit or roll back its transaction first")
    async with conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield conn
