"""Cutting a plugin's records into result batches.

A batch is cut when it holds ``max_records`` records or ``max_bytes`` bytes, or when its oldest
record is ``max_seconds`` old; :meth:`Batcher.finish` cuts the final one (possibly empty, since
the Gateway completes a task only after an accepted final batch).

Every batch is immutable once cut: its sequence number, its idempotency key
``"<attempt_id>:<sequence_number>"`` and the sha256 of its canonical payload
(:func:`domain.results.payload_sha256`, the same bytes the Gateway hashes) never change, so a
batch whose acknowledgement was lost is sent again *identically* and the Gateway answers
``duplicate: true`` instead of storing it twice.

The outbox is bounded: when the Gateway is slow, :meth:`Batcher.add` waits, the worker stops
reading the plugin's stdout, and the plugin blocks on its pipe — memory stays bounded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from leasehold.domain.results import payload_sha256

__all__ = ["Batch", "Batcher", "idempotency_key"]


def idempotency_key(attempt_id: UUID, sequence_number: int) -> str:
    """The key of batch ``sequence_number`` of an attempt: stable across retries, unique per task."""
    return f"{attempt_id}:{sequence_number}"


@dataclass(frozen=True, slots=True)
class Batch:
    sequence_number: int
    idempotency_key: str
    payload: list[dict[str, Any]]
    payload_sha256: str
    final: bool

    @property
    def record_count(self) -> int:
        return len(self.payload)


class Batcher:
    """Accumulates records and puts cut batches, in sequence, into :attr:`outbox`."""

    def __init__(self, attempt_id: UUID, *, max_records: int, max_seconds: float, max_bytes: int,
                 outbox_size: int = 4, clock: Callable[[], float] = time.monotonic) -> None:
        self.attempt_id = attempt_id
        self.max_records, self.max_seconds, self.max_bytes = max_records, max_seconds, max_bytes
        self.outbox: asyncio.Queue[Batch] = asyncio.Queue(maxsize=outbox_size)
        self._clock = clock
        self._records: list[dict[str, Any]] = []
        self._bytes = 0
        self._oldest: float | None = None
        self._sequence = 0
        self._finished = False
        self._woken = asyncio.Event()
        self.records_total = 0

    @property
    def batches_cut(self) -> int:
        return self._sequence

    async def add(self, record: dict[str, Any], size: int) -> None:
        """Add one record (``size``: its encoded length); may wait for room in the outbox."""
        if self._finished:
            raise RuntimeError("the final batch was already cut")
        if self._records and self._bytes + size > self.max_bytes:
            await self._cut(final=False)
        if not self._records:
            self._oldest = self._clock()
            self._woken.set()
        self._records.append(record)
        self._bytes += size
        self.records_total += 1
        if len(self._records) >= self.max_records or self._bytes >= self.max_bytes:
            await self._cut(final=False)

    async def finish(self) -> None:
        """Cut the final batch: the pending records, or none at all."""
        if not self._finished:
            await self._cut(final=True)
            self._finished = True
            self._woken.set()

    async def run_timer(self) -> None:
        """Cut the pending batch once its oldest record is ``max_seconds`` old (run as a task)."""
        while not self._finished:
            if self._oldest is None:
                self._woken.clear()
                await self._woken.wait()
                continue
            wait = self._oldest + self.max_seconds - self._clock()
            if wait > 0:
                self._woken.clear()
                try:
                    await asyncio.wait_for(self._woken.wait(), wait)
                except TimeoutError:
                    pass
                continue
            if self._records and not self._finished:
                await self._cut(final=False)

    async def _cut(self, *, final: bool) -> None:
        records, self._records, self._bytes, self._oldest = self._records, [], 0, None
        self._sequence += 1
        batch = Batch(sequence_number=self._sequence,
                      idempotency_key=idempotency_key(self.attempt_id, self._sequence),
                      payload=records, payload_sha256=payload_sha256(records), final=final)
        await self.outbox.put(batch)
