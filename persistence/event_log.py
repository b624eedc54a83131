"""The event log: stream heads, recording events (serialised, hash-chained) and reading them.

Appending happens in a command's transaction (:meth:`persistence.transaction.Transaction.append`)
with no table-wide lock: the caller already holds the row lock of the stream's own row (the
task, scan, worker…), so stream versions and the hash chain advance without contention, and the
unique ``(originator_id, originator_version)`` key turns any unlocked concurrent append into
an error instead of a fork. Global order for readers comes from ``transaction_id``, not from a
lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent
from psycopg import AsyncConnection

from domain.events import DomainEvent
from persistence.chain import GENESIS, chain_hash
from persistence.codec import MAPPER


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


def decode_event(originator_id: UUID, originator_version: int, topic: str, state: bytes) -> DomainEvent:
    """The domain event a stored row holds (upcast to the current class version)."""
    return MAPPER.to_domain_event(StoredEvent(originator_id=originator_id, originator_version=originator_version,
                                              topic=topic, state=state))


async def read_stream(conn: AsyncConnection[Any], originator_id: UUID, *,
                      up_to_version: int | None = None) -> list[DomainEvent]:
    """The events of one stream in order (optionally only up to a version)."""
    async with conn.cursor() as cur:
        await cur.execute(
            "SELECT originator_id, originator_version, topic, state FROM events"
            " WHERE originator_id = %s AND (%s::bigint IS NULL OR originator_version <= %s)"
            " ORDER BY originator_version",
            (originator_id, up_to_version, up_to_version))
        rows = await cur.fetchall()
    return [decode_event(r[0], r[1], r[2], bytes(r[3])) for r in rows]
