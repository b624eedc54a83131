"""The event log: stream heads, recording events (serialised, hash-chained) and reading them.

Appending happens in a command's transaction (:meth:`persistence.transaction.Transaction.append`)
with no table-wide lock: the caller already holds the row lock of the stream's own row (the
task, scan, worker…), so stream versions and the hash chain advance without contention, and the
unique ``(originator_id, originator_version)`` key turns any unlocked concurrent append into
an error instead of a fork. Global order for readers comes from ``transaction_id``, not from a
lock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent
from psycopg import AsyncConnection

from leasehold.domain.events import DomainEvent
from leasehold.persistence.chain import GENESIS, chain_hash
from leasehold.persistence.codec import MAPPER, decode_event
from leasehold.persistence.queries import QUERIES
from leasehold.persistence.rows import execute_named


@dataclass(frozen=True, slots=True)
class StreamHead:
    """Where a stream ends: its last version and that event's chain hash."""

    id: UUID
    version: int = 0
    hash: bytes = GENESIS


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    event: DomainEvent
    stored: StoredEvent
    hash: bytes
    prev_hash: bytes


def record(head: StreamHead, events: Sequence[DomainEvent]) -> tuple[list[RecordedEvent], StreamHead]:
    """Serialise ``events`` and extend the hash chain from ``head`` (pure)."""
    out: list[RecordedEvent] = []
    version, prev = head.version, head.hash
    for event in events:
        if event.originator_id != head.id or event.originator_version != version + 1:
            raise ValueError(f"event {type(event).__name__} v{event.originator_version} does not follow "
                             f"stream {head.id} at v{version}")
        stored = MAPPER.to_stored_event(event)
        h = chain_hash(prev, head.id, event.originator_version, stored.topic, stored.state)
        out.append(RecordedEvent(event, stored, h, prev))
        version, prev = event.originator_version, h
    return out, StreamHead(head.id, version, prev)


async def read_stream(conn: AsyncConnection[Any], originator_id: UUID, *,
                      up_to_version: int | None = None) -> list[DomainEvent]:
    """The events of one stream in order (optionally only up to a version)."""
    cur = await execute_named(
        conn, "SELECT originator_id, originator_version, topic, state FROM events"
              " WHERE originator_id = %s AND (%s::bigint IS NULL OR originator_version <= %s)"
              " ORDER BY originator_version",
        (originator_id, up_to_version, up_to_version))
    rows = await cur.fetchall()
    await cur.close()
    return [decode_event(r.originator_id, r.originator_version, r.topic, bytes(r.state)) for r in rows]


# --- reading stored rows (audits) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredRow:
    """One row of ``events``, every column."""

    notification_id: int
    originator_id: UUID
    originator_version: int
    topic: str
    state: bytes
    recorded_at: datetime
    transaction_id: int
    prev_hash: bytes
    hash: bytes

    @property
    def event_type(self) -> str:
        _, _, name = self.topic.rpartition(":")
        return name

    def decode(self) -> DomainEvent:
        return decode_event(self.originator_id, self.originator_version, self.topic, self.state)


def stored_row(r: Any) -> StoredRow:
    """A row of ``events`` (every column, ``transaction_id`` as text), read by name."""
    return StoredRow(notification_id=r.notification_id, originator_id=r.originator_id,
                     originator_version=r.originator_version, topic=r.topic, state=bytes(r.state),
                     recorded_at=r.recorded_at, transaction_id=int(r.transaction_id), prev_hash=bytes(r.prev_hash),
                     hash=bytes(r.hash))


async def stream_rows(conn: AsyncConnection[Any], originator_id: UUID) -> list[StoredRow]:
    """Every stored event of one stream, in version order."""
    cur = await execute_named(conn, QUERIES["stored_events_of_stream"], {"originator_id": originator_id})
    return [stored_row(r) for r in await cur.fetchall()]


async def rows_of_streams(conn: AsyncConnection[Any], ids: Iterable[UUID]) -> list[StoredRow]:
    """Every stored event of the given streams, in ``notification_id`` (log) order."""
    cur = await execute_named(conn, QUERIES["stored_events_of_streams"], {"originator_ids": list(ids)})
    return [stored_row(r) for r in await cur.fetchall()]


async def stream_type(conn: AsyncConnection[Any], originator_id: UUID) -> str | None:
    """The type of a stream's first event (``TaskCreated``, ``ScanCreated``…), None if unknown."""
    cur = await execute_named(conn, QUERIES["stream_first_topic"], {"originator_id": originator_id})
    row = await cur.fetchone()
    if row is None:
        return None
    _, _, name = str(row.topic).rpartition(":")
    return name


async def event_batches(conn: AsyncConnection[Any], *, batch_size: int = 10_000
                        ) -> AsyncIterator[list[tuple[Any, ...]]]:
    """The whole log in ``notification_id`` order, in batches of ``(originator_id, version, topic,
    state, hash)``, through a server-side cursor (memory holds one batch; needs a transaction).

    Binary results: byteas arrive as raw bytes, with no hex text to decode. The next batch is
    requested before the current one is handed out, so the server reads it (on its own CPU)
    while the caller folds this one.
    """
    async for batch in _batches(conn, "events_in_log_order", {}, batch_size):
        yield batch


async def group_batches(conn: AsyncConnection[Any], lo: UUID, hi: UUID | None, *, batch_size: int = 10_000
                        ) -> AsyncIterator[list[tuple[Any, ...]]]:
    """The events of the stream groups in ``[lo, hi)`` (``hi`` None: no upper bound), group by
    group in uuid order, each group in log order, in batches of ``(originator_id, version, topic,
    state, hash, group)`` (see ``events_by_group`` in ``queries/events.sql``); needs a transaction."""
    params = {"lo": lo, "hi": hi}
    await _plan_for_groups(conn)
    async for batch in _batches(conn, "events_by_group", params, batch_size):
        yield batch


async def batches_of_groups(conn: AsyncConnection[Any], groups: list[UUID], streams: list[UUID], *,
                            batch_size: int = 10_000) -> AsyncIterator[list[tuple[Any, ...]]]:
    """The same for a list of groups; ``streams`` are streams known to belong to them."""
    params = {"groups": groups, "streams": streams}
    await _plan_for_groups(conn)
    async for batch in _batches(conn, "events_of_groups", params, batch_size):
        yield batch


async def _plan_for_groups(conn: AsyncConnection[Any]) -> None:
    """The plan the grouped reads are written for: a nested loop of plain index scans, one per
    stream. Compiling it (JIT), caching its inner side (no stream is read twice) or bitmap scans
    (a stream is a few rows) only cost time here."""
    for setting in ("jit", "enable_memoize", "enable_bitmapscan"):
        await conn.execute(f"SET LOCAL {setting} = off")


async def streams_touched_since(conn: AsyncConnection[Any], checkpoint_id: int, transaction_xmin: int,
                                *, batch_size: int = 20_000) -> AsyncIterator[list[tuple[UUID, UUID]]]:
    """``(stream, group)`` of every stream with an event the checkpoint did not seal, in group
    order, in batches (a server-side cursor; needs a transaction)."""
    params = {"xmin": str(transaction_xmin), "checkpoint": checkpoint_id}
    async for batch in _batches(conn, "streams_touched_since", params, batch_size):
        yield batch


async def count_events(conn: AsyncConnection[Any]) -> int:
    cur = await execute_named(conn, QUERIES["events_count"])
    row = await cur.fetchone()
    assert row is not None, "an aggregate always returns a row"
    return int(row.count)


async def _batches(conn: AsyncConnection[Any], query: str, params: dict[str, Any], batch_size: int
                   ) -> AsyncIterator[list[tuple[Any, ...]]]:
    async with conn.cursor(name=f"replay_{query}", binary=True) as cur:
        await cur.execute(QUERIES[query], params)
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


async def log_end(conn: AsyncConnection[Any]) -> tuple[datetime, int | None]:
    """(the transaction's time, the last ``notification_id`` it sees; None for an empty log)."""
    cur = await execute_named(conn, QUERIES["events_log_end"])
    row = await cur.fetchone()
    assert row is not None, "an aggregate always returns a row"
    return row.now, row.position
