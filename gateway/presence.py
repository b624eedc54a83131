"""Worker presence: when each worker last polled, renewed and wrote, without a write per request.

Each Gateway process notes, in memory, the monotonic time of every worker request it serves, and
which workers wait in a long-poll right now (:class:`Presence`). A background loop publishes the workers that changed since its last pass,
every ``presence_publish_seconds``, in one statement (:func:`persistence.presence.publish`);
nothing is published when nothing changed. 1,000 long-polling workers cost one statement per
interval per process, however often they poll. A process that dies loses at most the last
interval; one that stops publishes what it holds on its way out.

What an operator is shown is judged by :func:`liveness` from the latest of the three times:
``live``, ``idle`` or ``gone``. Presence is not a lifecycle fact: it appends no event.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import IntEnum
from typing import Literal
from uuid import UUID

Liveness = Literal["live", "idle", "gone"]
LIVENESS: tuple[Liveness, ...] = ("live", "idle", "gone")


class Seen(IntEnum):
    """What a worker was seen doing."""

    POLL = 0  # an acquire (a long-poll counts when it starts and when it answers)
    RENEW = 1  # a lease renewal
    WRITE = 2  # any other attempt write: progress, results, complete, fail, cancel-ack, scope page


def liveness(seen: datetime | None, now: datetime, *, live: timedelta, idle: timedelta) -> Liveness:
    """``live`` when ``seen`` is at most ``live`` before ``now``; ``idle`` when at most ``idle``
    before; ``gone`` when longer ago, or never seen. (A ``seen`` after ``now``, a clock that
    another process read a moment later, is live.) The SQL filter of ``workers_page`` says the same."""
    if seen is None:
        return "gone"
    age = now - seen
    if age <= live:
        return "live"
    if age <= idle:
        return "idle"
    return "gone"


def latest(*times: datetime | None) -> datetime | None:
    """The latest of the times given (None when none is known)."""
    known = [t for t in times if t is not None]
    return max(known) if known else None


@dataclass(frozen=True, slots=True)
class Published:
    """What one publish sends: per worker, how many seconds ago each kind was last seen here
    (None: not since the process started)."""

    worker_ids: list[UUID]
    ages: tuple[list[float | None], list[float | None], list[float | None]]

    def __len__(self) -> int:
        return len(self.worker_ids)


class Presence:
    """The last time each worker was seen by this process, and which changed since the last
    publish. ``clock`` is monotonic (injectable for tests)."""

    __slots__ = ("_clock", "_seen", "_changed", "_waiting")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[UUID, list[float | None]] = {}
        self._changed: set[UUID] = set()
        self._waiting: Counter[UUID] = Counter()

    @contextmanager
    def waiting(self, worker_id: UUID) -> Iterator[None]:
        """While an acquire long-poll of ``worker_id`` waits here, every publish counts it as
        polling now: a worker waiting longer than ``worker_live_seconds`` still looks live."""
        self._waiting[worker_id] += 1
        try:
            yield
        finally:
            self._waiting[worker_id] -= 1
            if not self._waiting[worker_id]:
                del self._waiting[worker_id]

    def saw(self, worker_id: UUID, what: Seen) -> None:
        """Note that ``worker_id`` was seen doing ``what`` now. No I/O: on every worker request."""
        times = self._seen.get(worker_id)
        if times is None:
            times = self._seen[worker_id] = [None, None, None]
        times[what] = self._clock()
        self._changed.add(worker_id)

    @property
    def changed(self) -> int:
        """How many workers the next publish would send."""
        return len(self._changed | self._waiting.keys())

    def take(self) -> Published:
        """The changed workers (and those waiting in a long-poll, seen now), sorted by id, as
        ages now; they count as published (give them back with :meth:`give_back` if the
        publish fails)."""
        for worker_id in self._waiting:
            self.saw(worker_id, Seen.POLL)
        now = self._clock()
        ids = sorted(self._changed)
        self._changed = set()
        ages: tuple[list[float | None], list[float | None], list[float | None]] = ([], [], [])
        for worker_id in ids:
            times = self._seen[worker_id]
            for kind in Seen:
                t = times[kind]
                ages[kind].append(None if t is None else max(0.0, now - t))
        return Published(ids, ages)

    def give_back(self, published: Published) -> None:
        """A publish failed: its workers go out with the next one (with their times then)."""
        self._changed.update(published.worker_ids)
