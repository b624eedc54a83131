"""Row locks held by a transaction of the test's own, and a watch for sessions waiting on them:
how a test shows that a command skips a locked row (``SKIP LOCKED``) instead of waiting for it.
A wait is reported as soon as PostgreSQL sees it (``pg_blocking_pids``), never as a hang."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg

from support.waits import wait_until

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
    waiting: list[tuple[Any, ...]] = []

    async def waits_or_done() -> bool:
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT pid, left(query, 200) FROM pg_stat_activity"
                                     " WHERE %s = ANY(pg_blocking_pids(pid))", (holder_pid,))
            waiting[:] = await cur.fetchall()
        return bool(waiting) or job.done()

    # A wait that never comes is this watch's answer (an empty list), not a failure.
    with contextlib.suppress(AssertionError):
        await wait_until(waits_or_done, within, what="a session waiting for the holder's locks", interval=0.005)
    return job, list(waiting)
