"""The per-stream hash chain that makes the event log tamper-evident.

``hash = sha256(prev_hash || originator_id || version || topic || 0x00 || state)`` along each
stream (a task's, a scan's…), starting from 32 zero bytes. It is computed under the row lock
the command already holds on the stream's row, so it adds no contention. Any edited, deleted,
reordered or inserted event breaks the chain from that point on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

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
    expected_version, expected_prev = (prev[0] + 1, prev[1]) if prev else (1, GENESIS)
    if version != expected_version:
        return f"version {version} where {expected_version} was expected (events missing or inserted)"
    if prev_hash != expected_prev:
        return "prev_hash does not match the previous event's hash (deleted, reordered or forged)"
    if chain_hash(prev_hash, originator_id, version, topic, state) != stored_hash:
        return "hash does not match the event's content (edited)"
    return None


async def verify_chains(conn: AsyncConnection[Any], *, batch_size: int = 10000) -> list[ChainBreak]:
    """Walk every stream's chain in order; the first break of each broken stream."""
    breaks: list[ChainBreak] = []
    current: UUID | None = None
    prev: tuple[int, bytes] | None = None
    broken = False
    after: tuple[UUID, int] | None = None
    while True:
        cur = await conn.execute(
            "SELECT originator_id, originator_version, topic, state, prev_hash, hash FROM events"
            " WHERE %s::uuid IS NULL OR (originator_id, originator_version) > (%s::uuid, %s::bigint)"
            " ORDER BY originator_id, originator_version LIMIT %s",
            (after[0] if after else None, after[0] if after else None, after[1] if after else None,
             batch_size))
        rows = await cur.fetchall()
        if not rows:
            return breaks
        for oid, version, topic, state, prev_hash, h in rows:
            if oid != current:
                current, prev, broken = oid, None, False
            if not broken:
                problem = check_link(prev, oid, version, topic, bytes(state), bytes(prev_hash), bytes(h))
                if problem is not None:
                    breaks.append(ChainBreak(oid, version, problem))
                    broken = True
            prev = (version, bytes(h))
        after = (rows[-1][0], rows[-1][1])
