"""Row locks held by a transaction of the test's own, and a watch for sessions waiting on them:
how a test shows that a command skips a locked row (``SKIP LOCKED``) instead of waiting for it.
A wait is reported as soon as PostgreSQL sees it (``pg_blocking_pids``), never as a hang."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")


@asynccontextmanager
async def rows_locked(database_url: str, query: str, params: Any = None) -> AsyncIterator[int]:
    """Run ``query`` (a ``SELECT … FOR UPDATE``) in a transaction that stays open inside the block,
    on a connection of its own; yields that session's backend pid. The locks go when it ends."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        async with conn.transaction():
            cur = await conn.execute(query, params)
            assert await cur.fetchall(), "the query locked no row"
            yield conn.info.backend_pid


async def waits_while_running(pool: Any, holder_pid: int, work: Awaitable[T], *,
                              within: float = 10.0) -> tuple[asyncio.Future[T], list[tuple[Any, ...]]]:
    """Start ``work`` and watch until it finishes: the sessions found waiting for a lock that
    ``holder_pid`` holds (empty if none ever did). Returns at the first wait seen (``work`` then
    goes on once the holder lets go), or after ``within`` seconds; the caller awaits the future."""
    job = asyncio.ensure_future(work)
    deadline = time.monotonic() + within
    while not job.done() and time.monotonic() < deadline:
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT pid, left(query, 200) FROM pg_stat_activity"
                                     " WHERE %s = ANY(pg_blocking_pids(pid))", (holder_pid,))
            waiting = await cur.fetchall()
        if waiting:
            return job, list(waiting)
        await asyncio.sleep(0.005)
    return job, []
