"""The per-stream hash chain that makes the event log tamper-evident.

``hash = sha256(prev_hash || originator_id || version || topic || 0x00 || state)`` along each
stream (a task's, a scan's…), starting from 32 zero bytes. It is computed under the row lock
the command already holds on the stream's row, so it adds no contention. Any edited, deleted,
reordered or inserted event breaks the chain from that point on.
"""

from __future__ import annotations

import hashlib
from uuid import UUID

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
