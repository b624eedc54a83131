"""Project the whole event log into memory with the Gateway's own projector.

The one fold of the log: ``replay rebuild`` and ``replay verify`` use it, and so do the tests
of invariant 1 ("projections are a pure function of the log") and the demo's audit.
Events are read in ``notification_id`` order (the order :mod:`projections.projector` is written
for) through a server-side cursor (:func:`persistence.event_log.event_batches`), so memory holds
one batch of stored events at a time, and each is decoded
(:func:`persistence.codec.decode_event`), passed to :func:`projections.projector.project` and
the row changes applied to :class:`projections.memory.MemoryTables`. The caller provides the
transaction, normally a :func:`persistence.snapshot.snapshot`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from persistence.codec import decode_event
from persistence.event_log import event_batches
from projections.memory import MemoryTables
from projections.projector import project
from replay.gcpause import gc_paused

Progress = Callable[[int], None]


@dataclass(slots=True)
class Folded:
    """The projected tables, how many events made them, and how long it took."""

    tables: MemoryTables
    events: int
    seconds: float


async def fold(conn: AsyncConnection[Any], *, batch_size: int = 10_000, progress: Progress | None = None
               ) -> Folded:
    """Every projection, rebuilt in memory from the log visible to ``conn``'s transaction."""
    started = time.perf_counter()
    tables = MemoryTables()
    apply = tables.apply
    count = 0
    # project's own implementations, looked up once per event class (what singledispatch does on
    # every call, minus its wrapper).
    implementations: dict[type, Callable[[Any, bytes], Any]] = {}
    with gc_paused():
        async for batch in event_batches(conn, batch_size=batch_size):
            for oid, version, topic, state, h in batch:
                event = decode_event(oid, version, topic, state)
                impl = implementations.get(type(event))
                if impl is None:
                    impl = implementations[type(event)] = project.dispatch(type(event))
                apply(impl(event, h))
            count += len(batch)
            if progress is not None:
                progress(count)
    return Folded(tables, count, time.perf_counter() - started)
