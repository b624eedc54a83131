"""The per-stream hash chain that makes the event log tamper-evident.

``hash = sha256(prev_hash || originator_id || version || topic || 0x00 || state)`` along each
stream (a task's, a scan's…), starting from 32 zero bytes. It is computed under the row lock
the command already holds on the stream's row, so it adds no contention. Any edited, deleted,
reordered or inserted event breaks the chain from that point on.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus

from leasehold.persistence.queries import QUERIES
from leasehold.persistence.rows import named_rows

GENESIS = bytes(32)


def chain_hash(prev_hash: bytes, originator_id: UUID, originator_version: int, topic: str,
               state: bytes) -> bytes:
    """The hash of one stored event given the hash of the event before it in its stream."""
    h = hashlib.sha256(prev_hash)
    h.update(originator_id.bytes)
    h.update(originator_version.to_bytes(8, "big"))
    h.update(topic.encode())
    h.update(b"\x00")
    h.update(state)
    return h.digest()


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """The first broken link found in one stream."""

    originator_id: UUID
    originator_version: int
    problem: str

    def __str__(self) -> str:
        return f"stream {self.originator_id} v{self.originator_version}: {self.problem}"


def check_link(prev: tuple[int, bytes] | None, originator_id: UUID, version: int, topic: str,
               state: bytes, prev_hash: bytes, stored_hash: bytes) -> str | None:
    """What is wrong with one event given the (version, hash) before it in its stream, if anything."""
    prev_version, expected_prev = prev if prev else (0, GENESIS)
    expected_version = prev_version + 1
    if version != expected_version:
        return f"version {version} where {expected_version} was expected (events missing or inserted)"
    if prev_hash != expected_prev:
        return "prev_hash does not match the previous event's hash (deleted, reordered or forged)"
    if chain_hash(prev_hash, originator_id, version, topic, state) != stored_hash:
        return "hash does not match the event's content (edited)"
    return None


@dataclass(slots=True)
class ChainWalk:
    """What one pass over every stream's chain found."""

    streams: int = 0
    events: int = 0
    breaks: list[ChainBreak] = field(default_factory=list)


async def walk_chains(conn: AsyncConnection[Any], *, batch_size: int = 20_000,
                      progress: Callable[[int], None] | None = None,
                      seed: dict[UUID, tuple[int, bytes]] | None = None) -> ChainWalk:
    """Walk every stream's chain in order, in one pass over the log; the first break of each
    broken stream. ``progress`` is called with the events walked so far after each batch.
    ``seed`` gives, for streams whose earlier events are archived, the (version, hash) their
    first event in the log must follow (else a stream starts at v1 from 32 zero bytes).

    The log is read through a server-side cursor (memory holds one batch), inside the caller's
    transaction, or in one of its own when ``conn`` has none.
    """
    walk = ChainWalk()
    current: UUID | None = None
    prev: tuple[int, bytes] | None = None
    broken = False
    async with _in_a_transaction(conn), conn.cursor(name="replay_chain_walk", binary=True,
                                                     row_factory=named_rows) as cur:
        await cur.execute(QUERIES["events_in_stream_order"])
        while rows := await cur.fetchmany(batch_size):
            for r in rows:
                oid, version, topic, state, prev_hash, h = (r.originator_id, r.originator_version, r.topic, r.state,
                                                            r.prev_hash, r.hash)
                if oid != current:
                    current, prev, broken = oid, seed.get(oid) if seed else None, False
                    walk.streams += 1
                if not broken:
                    problem = check_link(prev, oid, version, topic, state, prev_hash, h)
                    if problem is not None:
                        walk.breaks.append(ChainBreak(oid, version, problem))
                        broken = True
                prev = (version, h)
            walk.events += len(rows)
            if progress is not None:
                progress(walk.events)
    return walk


async def verify_chains(conn: AsyncConnection[Any]) -> list[ChainBreak]:
    """The first break of each broken stream (:func:`walk_chains`'s findings alone)."""
    return (await walk_chains(conn)).breaks


@asynccontextmanager
async def _in_a_transaction(conn: AsyncConnection[Any]) -> AsyncIterator[None]:
    """A server-side cursor lives in a transaction: the caller's, or one opened for it."""
    if conn.info.transaction_status == TransactionStatus.IDLE:
        async with conn.transaction():
            yield
    else:
        yield
