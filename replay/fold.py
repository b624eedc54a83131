"""Project the event log into memory with the Gateway's own projector: the one fold of the log.

``replay rebuild`` and ``replay verify`` use it (through :mod:`replay.parallel`), and so do the
tests of invariant 1 ("projections are a pure function of the log") and the demo's audit.
Each stored event is decoded (:func:`persistence.codec.decode_event`), passed to
:func:`projections.projector.project` and the row changes applied to
:class:`projections.memory.MemoryTables` (:class:`Folder`). Two ways to feed it:

- :func:`fold`: the whole log in ``notification_id`` order (the order
  :mod:`projections.projector` is written for) into one set of tables; memory grows with the log.
- :func:`fold_groups`: the log stream group by stream group (a scan with its tasks; every other
  stream alone, see ``events_by_group`` in ``persistence/queries/events.sql``), each group in
  log order. No row is written by two groups, so the tables of a run of groups are final once
  its groups are folded: they are handed out chunk by chunk and forgotten, and memory holds one
  chunk whatever the size of the log.

Both read through server-side cursors in the caller's transaction, normally a
:func:`persistence.snapshot.snapshot`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from leasehold.persistence.codec import decode_event
from leasehold.persistence.event_log import event_batches
from leasehold.projections.memory import MemoryTables, Tables
from leasehold.projections.projector import project
from leasehold.replay.gcpause import gc_paused

Progress = Callable[[int], None]

#: Events per chunk of :func:`fold_groups` (a chunk ends at the first group boundary after it):
#: large enough that per-chunk costs vanish, small enough that memory stays a few tens of MB.
CHUNK_EVENTS = 20_000


@dataclass(slots=True)
class Folded:
    """The projected tables, how many events made them, and how long it took."""

    tables: MemoryTables
    events: int
    seconds: float


class Folder:
    """Folds stored events, rows whose first five columns are ``(originator_id, version, topic,
    state, hash)``, into :class:`~projections.memory.MemoryTables`."""

    __slots__ = ("_implementations", "events", "tables")

    def __init__(self) -> None:
        self.tables = MemoryTables()
        self.events = 0
        # project's own implementations, looked up once per event class (what singledispatch
        # does on every call, minus its wrapper).
        self._implementations: dict[type, Callable[[Any, bytes], Any]] = {}

    def fold(self, rows: Sequence[tuple[Any, ...]]) -> None:
        apply = self.tables.apply
        implementations = self._implementations
        for row in rows:
            event = decode_event(row[0], row[1], row[2], row[3])
            impl = implementations.get(type(event))
            if impl is None:
                impl = implementations[type(event)] = project.dispatch(type(event))
            apply(impl(event, row[4]))
        self.events += len(rows)

    def take(self) -> Tables:
        """The tables folded so far; the folder starts again from empty ones."""
        tables = self.tables.tables
        self.tables = MemoryTables()
        return tables


async def fold(conn: AsyncConnection[Any], *, batch_size: int = 10_000, progress: Progress | None = None
               ) -> Folded:
    """Every projection, rebuilt in memory from the whole log visible to ``conn``'s transaction."""
    started = time.perf_counter()
    folder = Folder()
    with gc_paused():
        async for batch in event_batches(conn, batch_size=batch_size):
            folder.fold(batch)
            if progress is not None:
                progress(folder.events)
    return Folded(folder.tables, folder.events, time.perf_counter() - started)


@dataclass(frozen=True, slots=True)
class Chunk:
    """The complete rows of the groups before ``bound`` (None: of every group left), made by
    ``events`` events."""

    tables: Tables
    bound: UUID | None
    events: int


async def fold_groups(batches: AsyncIterable[list[tuple[Any, ...]]], *, chunk_events: int = CHUNK_EVENTS,
                      progress: Progress | None = None) -> AsyncIterator[Chunk]:
    """Fold ``batches`` of events in group order (rows of :func:`~persistence.event_log.group_batches`:
    the group is the sixth column) chunk by chunk: a chunk closes at the first group boundary
    after ``chunk_events`` events. ``progress`` gets the events folded so far after each batch."""
    folder = Folder()
    done = 0
    group: Any = None  # of the last event folded
    carry: list[tuple[Any, ...]] = []
    async for batch in batches:
        rows = carry + batch if carry else batch
        carry = []
        if folder.events + len(rows) >= chunk_events:
            last = rows[-1][5]
            cut = len(rows)
            while cut and rows[cut - 1][5] == last:  # the last group may go on in the next batch
                cut -= 1
            if cut or (folder.events and group != last):
                folder.fold(rows[:cut])
                done += folder.events
                yield Chunk(folder.take(), last, folder.events)
                folder.events = 0
                carry = rows[cut:]
                if progress is not None:
                    progress(done)
                continue
        folder.fold(rows)
        group = rows[-1][5]
        if progress is not None:
            progress(done + folder.events)
    if carry:
        folder.fold(carry)
    yield Chunk(folder.take(), None, folder.events)
