"""Project the whole event log into memory with the Gateway's own projector.

Events are read in ``notification_id`` order (the order :mod:`projections.projector` is written
for) through a server-side cursor, so memory holds one batch of stored events at a time, and
each is decoded (:mod:`replay.decode`), passed to :func:`projections.projector.project` and the
row changes applied to :class:`projections.memory.MemoryTables`. The caller provides the
transaction, normally a :func:`replay.snapshot.snapshot`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from projections.memory import MemoryTables
from projections.projector import project
from replay.decode import DECODE, Decoder
from replay.gcpause import gc_paused
from replay.tables import FastMemoryTables

Progress = Callable[[int], None]

_SELECT = ("SELECT originator_id, originator_version, topic, state, hash FROM events"
           " ORDER BY notification_id")


@dataclass(slots=True)
class Folded:
    """The projected tables, how many events made them, and how long it took."""

    tables: MemoryTables
    events: int
    seconds: float


async def event_batches(conn: AsyncConnection[Any], *, batch_size: int = 10_000
                        ) -> AsyncIterator[list[tuple[Any, ...]]]:
    """Batches of ``(originator_id, version, topic, state, hash)`` in log order (needs a transaction).

    Binary results: byteas arrive as raw bytes, with no hex text to decode. The next batch is
    requested before the current one is handed out, so the server reads it (on its own CPU)
    while the caller folds this one.
    """
    async with conn.cursor(name="replay_events", binary=True) as cur:
        await cur.execute(_SELECT)
        pending = asyncio.ensure_future(cur.fetchmany(batch_size))
        try:
            while rows := await pending:
                pending = asyncio.ensure_future(cur.fetchmany(batch_size))
                await asyncio.sleep(0)  # let the request go out before the caller takes the CPU
                yield rows
        finally:
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending


async def fold(conn: AsyncConnection[Any], *, batch_size: int = 10_000, progress: Progress | None = None,
               decode: Decoder = DECODE, tables: MemoryTables | None = None) -> Folded:
    """Every projection, rebuilt in memory from the log visible to ``conn``'s transaction."""
    started = time.perf_counter()
    tables = tables if tables is not None else FastMemoryTables()
    apply = tables.apply
    count = 0
    # project's own implementations, looked up once per event class (what singledispatch does on
    # every call, minus its wrapper).
    implementations: dict[type, Callable[[Any, bytes], Any]] = {}
    with gc_paused():
        async for batch in event_batches(conn, batch_size=batch_size):
            for oid, version, topic, state, h in batch:
                event = decode(oid, version, topic, state)
                impl = implementations.get(type(event))
                if impl is None:
                    impl = implementations[type(event)] = project.dispatch(type(event))
                apply(impl(event, h))
            count += len(batch)
            if progress is not None:
                progress(count)
    return Folded(tables, count, time.perf_counter() - started)
