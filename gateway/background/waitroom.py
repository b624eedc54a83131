"""The wait room: where this process's acquire long-polls wait, costing the database nothing.

An acquire polls the database once (:meth:`gateway.commands.lifecycle.Lifecycle.poll`). When
that finds nothing, the long-poll *parks* here with what decides whether a notification could
concern it — its worker's organisations and task types, and the cancels it already knows,
all taken from that same poll — and does no database work of its own until it is woken:

* ``available:<organisation>`` (a task was queued or requeued, :mod:`gateway.commands.wakeups`)
  wakes at most :attr:`WaitRoom.batch` waiters serving that organisation, those parked longest
  first, never one of another organisation. A woken waiter that then leases a task passes the
  baton: it wakes one more waiter of the task's organisation, so a burst of queued tasks is
  taken by a chain of polls that stops at the first poll that finds nothing, not by a herd.
  A long-poll polling when a notification arrives is not parked, so cannot be woken: when the
  notification woke nobody, such a poll (which may not have seen the change) polls again
  instead of parking (:meth:`WaitRoom.missed`).
* ``cancel:<worker>`` wakes that worker's waiters; ``worker:<worker>`` (the worker was changed:
  disabled, revoked, its organisations or task types) wakes them and forgets what was cached.
* One fallback sweep per process (:func:`run_sweep`, every ``wake_sweep_seconds``) covers
  notifications that never arrived: one read-only transaction asks which organisations its
  waiters serve have work that can be leased now (and which waiting workers have a cancel they
  were not told of), and wakes at most ``batch`` waiters that could take it.
* When the LISTEN connection comes back after a loss, every waiter is woken once (notifications
  may have been missed); when the Gateway stops, every waiter answers at once.

A worker whose long-poll ended with nothing usually asks again at once. While the LISTEN
connection is up and nothing that concerns the worker was notified since its last poll began
(same organisations, no cancel it does not know, no sweep finding work for it, the cached poll
younger than :attr:`WaitRoom.profile_seconds`), that next long-poll parks without polling: the
poll would find what the last one found. So an idle fleet costs the database one sweep per
process every ``wake_sweep_seconds``, whatever its size.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from leasehold.gateway.background.loops import stop_if_cancelled
from leasehold.persistence.transaction import Database

log = logging.getLogger("leasehold.waitroom")

_ids = itertools.count(1)


@dataclass(eq=False)
class Waiter:
    """One parked long-poll."""

    worker_id: str
    organizations: frozenset[str]
    task_types: frozenset[str]
    known_cancels: frozenset[str]
    event: asyncio.Event = field(default_factory=asyncio.Event)
    #: The organisation whose notification (or sweep) woke it: the baton goes on there.
    woken_for: str | None = None
    order: int = field(default_factory=lambda: next(_ids))


@dataclass(frozen=True)
class Profile:
    """What a worker's last poll that found nothing saw."""

    organizations: frozenset[str]
    task_types: frozenset[str]
    cancelling: frozenset[str]
    #: :attr:`WaitRoom.seq` just before that poll began.
    seq: int
    polled_at: float
    #: The poll's warning (e.g. the worker has no task types), repeated on the skipped polls.
    warning: str | None = None


class WaitRoom:
    """The parked long-polls of this process and what wakes them (see the module)."""

    def __init__(self, *, batch: int = 4, profile_seconds: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.batch = batch
        self.profile_seconds = profile_seconds
        self.clock = clock
        self.closed = False
        #: Bumped by everything that may make a poll find something new.
        self.seq = 0
        self._by_org: dict[str, dict[Waiter, None]] = {}
        self._by_worker: dict[str, dict[Waiter, None]] = {}
        self._org_seq: dict[str, int] = {}
        self._worker_seq: dict[str, int] = {}
        #: (organisation, task type) -> seq of the last sweep that found such work leasable.
        self._work_seq: dict[tuple[str, str], int] = {}
        self._reset_seq = 0
        self._profiles: dict[str, Profile] = {}
        #: Sweeps run (tests wait on it).
        self.sweeps = 0

    # --- what the acquire does ---------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._by_worker.values())

    def remember(self, worker_id: UUID, *, organizations: Iterable[object], task_types: Iterable[str],
                 cancelling: Iterable[object], seq: int, warning: str | None = None) -> Profile:
        """The worker's poll (begun at ``seq``) found nothing: cache what it saw."""
        profile = Profile(frozenset(str(o) for o in organizations), frozenset(task_types),
                          frozenset(str(a) for a in cancelling), seq, self.clock(), warning)
        self._profiles[str(worker_id)] = profile
        return profile

    def forget(self, worker_id: UUID) -> None:
        """The worker's next acquire polls (one of its attempts ended in this process)."""
        self._profiles.pop(str(worker_id), None)

    def missed(self, worker_id: UUID, profile: Profile) -> bool:
        """Whether something concerning the worker was notified (or swept) after its poll began:
        that poll may not have seen it, and it was not parked to be woken, so it polls again."""
        key = str(worker_id)
        return (self._reset_seq > profile.seq or self._worker_seq.get(key, -1) > profile.seq
                or any(self._org_seq.get(o, -1) > profile.seq for o in profile.organizations)
                or any(self._work_seq.get((o, t), -1) > profile.seq
                       for o in profile.organizations for t in profile.task_types))

    def unchanged(self, worker_id: UUID, known_cancels: Iterable[object]) -> Profile | None:
        """The worker's cached profile when a poll now would find what its last one found."""
        key = str(worker_id)
        profile = self._profiles.get(key)
        if profile is None:
            return None
        # A change bumped to a seq above the profile's came after that poll began.
        if (self.clock() - profile.polled_at > self.profile_seconds or self.missed(worker_id, profile)
                or not profile.cancelling <= {str(a) for a in known_cancels}):
            return None
        return profile

    def park(self, worker_id: UUID, profile: Profile, known_cancels: Iterable[object]) -> Waiter:
        waiter = Waiter(str(worker_id), profile.organizations, profile.task_types,
                        frozenset(str(a) for a in known_cancels))
        for org in waiter.organizations:
            self._by_org.setdefault(org, {})[waiter] = None
        self._by_worker.setdefault(waiter.worker_id, {})[waiter] = None
        return waiter

    def leave(self, waiter: Waiter) -> None:
        for org in waiter.organizations:
            parked = self._by_org.get(org)
            if parked is not None:
                parked.pop(waiter, None)
                if not parked:
                    del self._by_org[org]
        parked = self._by_worker.get(waiter.worker_id)
        if parked is not None:
            parked.pop(waiter, None)
            if not parked:
                del self._by_worker[waiter.worker_id]

    async def wait(self, waiter: Waiter, seconds: float) -> bool:
        """Wait parked until woken or ``seconds`` pass; True when woken. Leaves the room either way."""
        if self.closed:
            self.leave(waiter)
            return False
        try:
            await asyncio.wait_for(waiter.event.wait(), seconds)
            return True
        except TimeoutError:
            return False
        finally:
            self.leave(waiter)

    def leased(self, waiter: Waiter | None, organization_id: object) -> None:
        """A woken waiter's poll leased a task of ``organization_id``: there may be more; wake the
        next waiter of that organisation (the baton)."""
        if waiter is not None and waiter.woken_for is not None:
            self._wake_org(str(organization_id), 1)

    # --- what wakes waiters ------------------------------------------------------------------

    def _bump(self) -> int:
        self.seq += 1
        return self.seq

    def _wake(self, waiter: Waiter, org: str | None) -> bool:
        if waiter.event.is_set():
            return False
        waiter.woken_for = org
        waiter.event.set()
        return True

    def _wake_org(self, org: str, limit: int, task_types: frozenset[str] | None = None) -> int:
        woken = 0
        for waiter in list(self._by_org.get(org, {})):
            if woken >= limit:
                break
            if task_types is not None and not waiter.task_types & task_types:
                continue
            if self._wake(waiter, org):
                woken += 1
        return woken

    def dispatch(self, topic: str) -> None:
        """A notification (NOTIFY payload or Redis hint) arrived."""
        kind, _, subject = topic.partition(":")
        if kind == "available":
            # A waiter woken now polls after the change committed, so it sees it. Only when none
            # was parked to be woken must the long-polls polling right now (which may not see it)
            # poll again, and no long-poll of the organisation's workers skip its poll.
            if not self._wake_org(subject, self.batch):
                self._org_seq[subject] = self._bump()
        elif kind in ("cancel", "worker"):
            self._worker_seq[subject] = self._bump()
            if kind == "worker":
                self._profiles.pop(subject, None)
            for waiter in list(self._by_worker.get(subject, {})):
                self._wake(waiter, None)

    def wake_all(self) -> None:
        """Notifications may have been missed: every waiter re-polls once, and no poll is skipped
        on what was cached before."""
        self._reset_seq = self._bump()
        self._profiles.clear()
        for parked in list(self._by_worker.values()):
            for waiter in list(parked):
                self._wake(waiter, None)

    def close(self) -> None:
        """The Gateway is stopping: every waiter answers now; later waits return at once."""
        self.closed = True
        self.wake_all()

    # --- the fallback sweep ------------------------------------------------------------------

    def sweep_subjects(self) -> tuple[list[str], list[str]]:
        """The organisations and the workers this process's waiters wait for."""
        return list(self._by_org), list(self._by_worker)

    def swept(self, available: dict[str, frozenset[str]], cancelling: Iterable[tuple[object, object]]) -> int:
        """What one sweep found: the organisations with work that can be leased now (and its task
        types), the (worker, attempt) cancels pending. Wakes at most :attr:`batch` waiters that
        could take the work, and every waiter told of a cancel it does not know; returns how many."""
        self.sweeps += 1
        woken = 0
        for worker, attempt in cancelling:
            for waiter in list(self._by_worker.get(str(worker), {})):
                if str(attempt) not in waiter.known_cancels and self._wake(waiter, None):
                    self._worker_seq[waiter.worker_id] = self._bump()
                    woken += 1
        for org, types in available.items():
            seq = self._bump()
            for task_type in types:
                self._work_seq[(org, task_type)] = seq
        # Round robin over the organisations, longest-parked waiters first, ``batch`` in all.
        budget = self.batch
        pending = list(available.items())
        while budget > 0 and pending:
            still = []
            for org, types in pending:
                if budget <= 0:
                    break
                if self._wake_org(org, 1, types):
                    budget -= 1
                    woken += 1
                    still.append((org, types))
            pending = still
        return woken


async def sweep(room: WaitRoom, db: Database, now: datetime | None = None) -> int:
    """One fallback sweep: one read-only transaction, only when long-polls wait."""
    organizations, workers = room.sweep_subjects()
    if not workers:
        return 0
    async with db.snapshot() as reader:
        work = await reader.all("waiting_organizations_with_work",
                                {"organization_ids": organizations, "now": now})
        cancels = await reader.all("waiting_workers_cancelling", {"worker_ids": workers})
    return room.swept({str(w.organization_id): frozenset(w.task_types) for w in work},
                      [(c.worker_id, c.id) for c in cancels])


async def run_sweep(room: WaitRoom, db: Database, every: float, clock: Callable[[], datetime | None]) -> None:
    """The process's fallback sweep, every ``every`` seconds, forever (an outage skips one)."""
    while True:
        await asyncio.sleep(every)
        try:
            await sweep(room, db, clock())
        except Exception as exc:  # an outage skips a sweep; a cancellation stops the loop
            stop_if_cancelled(exc)
