"""The LISTEN side of wake-ups: a dedicated connection that receives the NOTIFY payloads every
committed :meth:`persistence.transaction.Transaction.notify` sends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from psycopg import sql

from leasehold.persistence.transaction import NOTIFY_CHANNEL


@asynccontextmanager
async def listening(url: str, *, connect_timeout: int = 5) -> AsyncIterator[AsyncIterator[str]]:
    """A new connection listening on the wake-up channel; yields the stream of payloads.

    Raises what psycopg raises when the connection cannot be made or is lost (the caller
    reconnects).
    """
    async with await psycopg.AsyncConnection.connect(url, autocommit=True,
                                                     connect_timeout=connect_timeout) as conn:
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL)))
        yield (note.payload async for note in conn.notifies())
