"""Scheduled scans: create/list/pause/resume/delete/run-now, and the scheduler's ``claim_due``.

Each command is one transaction: lock the schedule row (``schedule_lock``), read it with a
separate statement after the lock (``schedule_read_many``), decide with :mod:`domain.schedule`,
append the events, commit. ``claim_due`` locks every due schedule it takes with ``FOR UPDATE
SKIP LOCKED`` and, in that same transaction, creates each one's scan (``ScanCreated``,
``ScanProfileSet``, the first step's job and task, exactly as :meth:`Registry.create_scan`
does) and appends ``ScheduleFired`` (or ``ScheduleSkipped``) moving ``next_run_at`` on. So any
number of Gateway processes can run the loop: a slot's scan and the schedule's advance commit
together or not at all, and a locked schedule is skipped by the other claimers.

Each claimed schedule runs in a savepoint of its own: one whose scan cannot be created (its row
cannot be read, the domain refuses it, the database raises) is rolled back alone, logged, and
left out of this process's claims for a while (:class:`FailureBackoff`); the rest of the batch
commits. The failing schedule stays enabled and due, so it fires as soon as its cause is gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import psycopg

from leasehold.domain import scan as scan_rules
from leasehold.domain import schedule as rules
from leasehold.domain.admission import AdmissionRefused
from leasehold.domain.errors import LeaseholdError, NotFound
from leasehold.domain.events import DomainEvent, MisfirePolicy, ProfileStep, ScheduleFired
from leasehold.domain.profiles import LegacyExecuted
from leasehold.domain.schedule import ScheduleState, Timing
from leasehold.domain.targets import check_scope, policy_from_json
from leasehold.gateway.commands.scans import open_scheduled_scan
from leasehold.persistence.event_log import StreamHead
from leasehold.persistence.rows import ScheduleRow
from leasehold.persistence.transaction import Clock, Database, Transaction, one, system_clock
from leasehold.protocol.targets import resolve_names

SCHEDULER_ACTOR = "scheduler"

log = logging.getLogger("leasehold.scheduler")


class FailureBackoff:
    """Schedules whose scan could not be created, left out of this process's claims for a while:
    ``initial_seconds`` after the first failure, doubling with each further one up to
    ``max_seconds``; forgotten at the first success (or once long expired)."""

    def __init__(self, *, initial_seconds: float = 2.0, max_seconds: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.initial, self.max, self.clock = initial_seconds, max_seconds, clock
        self._failures: dict[UUID, tuple[int, float]] = {}  # id -> (consecutive failures, retry at)

    def skipped(self) -> list[UUID]:
        """The schedules to leave out of a claim now."""
        now = self.clock()
        for sid, (_, retry_at) in list(self._failures.items()):
            if retry_at + self.max < now:  # not claimed again for long (paused, deleted, fixed elsewhere)
                del self._failures[sid]
        return [sid for sid, (_, retry_at) in self._failures.items() if retry_at > now]

    def failed(self, schedule_id: UUID) -> tuple[int, float]:
        """Record a failure; returns (consecutive failures, seconds until the next try)."""
        before, _ = self._failures.get(schedule_id, (0, 0.0))
        count = before + 1
        delay = min(self.max, self.initial * 2 ** (count - 1))
        self._failures[schedule_id] = (count, self.clock() + delay)
        return count, delay

    def succeeded(self, schedule_id: UUID) -> None:
        self._failures.pop(schedule_id, None)


class Schedules:
    """Scheduled-scan commands. ``organization_id`` None means an administrator (any org)."""

    def __init__(self, db: Database, *, clock: Clock = system_clock,
                 new_id: Callable[[], UUID] = uuid4, backoff: FailureBackoff | None = None,
                 on_failure: Callable[[UUID], None] | None = None) -> None:
        self.db, self.clock, self.new_id = db, clock, new_id
        self.backoff = backoff if backoff is not None else FailureBackoff()
        self.on_failure = on_failure
        #: Called for each due slot the organisation's admission cap refused (metrics hook).
        self.on_admission_refused: Callable[[], None] = lambda: None

    async def create(self, organization_id: UUID, *, name: str, targets: dict[str, Any],
                     profile: Sequence[ProfileStep], cron: str | None = None, interval_seconds: int | None = None,
                     timezone: str = "UTC", misfire_policy: MisfirePolicy = "run_once",
                     actor: str = "system") -> UUID:
        schedule_id = self.new_id()
        timing = Timing(cron, interval_seconds, timezone)
        resolved = await resolve_names(targets)  # checked again (names only) each time it fires
        async with self.db.transaction() as tx:
            row, policy = await tx.read(
                one("organization_exists", {"organization_id": organization_id, "now": self.clock()}),
                one("organization_target_policy", {"organization_id": organization_id}))
            if row is None or policy is None:
                raise NotFound("no such organisation", organization_id=str(organization_id))
            check_scope(policy_from_json(policy.target_policy), targets, resolved)
            scan_rules.set_profile(schedule_id, 1, tuple(profile), now=row.now, actor=actor)  # validates steps
            event = rules.create(schedule_id, organization_id, name=name, timing=timing, targets=dict(targets),
                                 profile=tuple(profile), misfire_policy=misfire_policy, now=row.now, actor=actor)
            tx.append(StreamHead(schedule_id), [event])
            await tx.commit()
        return schedule_id

    async def get(self, schedule_id: UUID, *, organization_id: UUID | None = None) -> dict[str, Any]:
        async with self.db.read() as reader:
            found = await reader.dicts("schedule_get", {"schedule_id": schedule_id,
                                                        "organization_id": organization_id})
        for schedule in found:
            return schedule
        raise NotFound("no such schedule", schedule_id=str(schedule_id))

    async def list(self, *, organization_id: UUID | None = None, limit: int = 500) -> list[dict[str, Any]]:
        async with self.db.read() as reader:
            return await reader.dicts("schedule_list", {"organization_id": organization_id, "limit": limit})

    async def pause(self, schedule_id: UUID, *, organization_id: UUID | None = None,
                    actor: str = "system") -> None:
        await self._on_schedule(schedule_id, organization_id,
                                lambda s, now, tx: _const(rules.set_enabled(s, False, now=now, actor=actor)))

    async def resume(self, schedule_id: UUID, *, organization_id: UUID | None = None,
                     actor: str = "system") -> None:
        await self._on_schedule(schedule_id, organization_id,
                                lambda s, now, tx: _const(rules.set_enabled(s, True, now=now, actor=actor)))

    async def delete(self, schedule_id: UUID, *, organization_id: UUID | None = None,
                     actor: str = "system") -> None:
        await self._on_schedule(schedule_id, organization_id,
                                lambda s, now, tx: _const(rules.delete(s, now=now, actor=actor)))

    async def run_now(self, schedule_id: UUID, *, organization_id: UUID | None = None,
                      actor: str = "system") -> UUID:
        """Create one scan of the schedule now (paused schedules too); ``next_run_at`` unchanged."""
        scan_id = self.new_id()

        async def decide(s: ScheduleState, now: datetime, tx: Transaction) -> list[DomainEvent]:
            await open_scheduled_scan(tx, scan_id, s, now=now, actor=actor, new_id=self.new_id)
            return [rules.run_now(s, scan_id=scan_id, now=now, actor=actor)]

        await self._on_schedule(schedule_id, organization_id, decide)
        return scan_id

    async def claim_due(self, limit: int = 100) -> int:
        """Handle up to ``limit`` due schedules in one transaction, each in a savepoint of its
        own; returns how many were handled (fired or skipped). A schedule that fails is rolled
        back alone, logged and backed off (:class:`FailureBackoff`); it does not count."""
        async with self.db.transaction() as tx:
            locked = await tx.all("schedule_claim_due", {"now": self.clock(), "limit": limit,
                                                         "skip": self.backoff.skipped()})
            if not locked:
                return 0
            now = next(iter(locked)).now
            ids = [r.id for r in locked]
            rows = {r.id: r for r in await tx.all("schedule_read_many", {"ids": ids})}
            handled = 0
            for sid in ids:
                try:
                    # A savepoint: an exception (or an error the server raised) undoes this schedule
                    # only. In pipeline mode a server error may surface only when the block ends.
                    async with tx.savepoint():
                        n = await self._handle_due(tx, rows[sid], now)
                except Exception as exc:
                    if tx.broken:
                        raise  # the connection itself failed: the whole pass fails and is retried
                    self._failed(rows[sid], exc)
                else:
                    handled += n
                    self.backoff.succeeded(sid)
            await tx.commit()
        return handled

    async def _handle_due(self, tx: Transaction, row: Any, now: datetime) -> int:
        s, head = _state(row)
        scan_id = self.new_id()
        event = rules.on_due(s, scan_id=scan_id, now=now, actor=SCHEDULER_ACTOR)
        if event is None:
            return 0
        if isinstance(event, ScheduleFired):
            try:
                await open_scheduled_scan(tx, scan_id, s, now=now, actor=SCHEDULER_ACTOR, new_id=self.new_id)
            except AdmissionRefused as refused:  # over the cap: the slot is skipped, not retried
                event = rules.refused(event, refused.message)
                self.on_admission_refused()
        tx.append(head, [event])
        return 1

    def _failed(self, row: Any, exc: Exception) -> None:
        schedule_id, organization_id = row.id, row.organization_id
        failures, delay = self.backoff.failed(schedule_id)
        if isinstance(exc, LegacyExecuted):
            log.info("scheduled scan waits: its organisation is legacy-executed",
                     extra={"schedule_id": str(schedule_id), "organization_id": str(organization_id),
                            "retry_in_seconds": delay})
            return
        log.warning("scheduled scan could not be created; schedule backed off",
                    extra={"schedule_id": str(schedule_id), "organization_id": str(organization_id),
                           "error": describe_error(exc), "failures": failures, "retry_in_seconds": delay})
        if self.on_failure is not None:
            self.on_failure(schedule_id)

    async def _on_schedule(self, schedule_id: UUID, organization_id: UUID | None, decide: Any) -> None:
        async with self.db.transaction() as tx:
            locked = await tx.one("schedule_lock", {"schedule_id": schedule_id, "organization_id": organization_id,
                                                    "now": self.clock()})
            if locked is None:
                raise NotFound("no such schedule", schedule_id=str(schedule_id))
            now = locked.now
            ((s, head),) = await _read(tx, [schedule_id])
            tx.append(head, await decide(s, now, tx))
            await tx.commit()


async def _const(events: list[DomainEvent]) -> list[DomainEvent]:
    return events


async def _read(tx: Transaction, ids: list[UUID]) -> list[tuple[ScheduleState, StreamHead]]:
    """The locked schedules, read by a statement of their own after the lock, in lock order."""
    rows = {r.id: r for r in await tx.all("schedule_read_many", {"ids": ids})}
    return [_state(rows[sid]) for sid in ids]


def _state(row: ScheduleRow) -> tuple[ScheduleState, StreamHead]:
    """A ``schedule_read_many`` row as the domain's state and the stream's head."""
    state = ScheduleState(
        id=row.id, version=row.version, organization_id=row.organization_id, name=row.name,
        timing=Timing(row.cron, row.interval_seconds, row.timezone), targets=row.targets,
        profile=tuple(ProfileStep(**step) for step in row.profile["steps"]), enabled=row.enabled,
        misfire_policy=row.misfire_policy, next_run_at=row.next_run_at, deleted=row.deleted)
    return state, StreamHead(row.id, row.version, bytes(row.head_hash))


def describe_error(exc: BaseException, limit: int = 300) -> str:
    """A short, log-safe description: the error's kind and its primary message (a server
    error's DETAIL, which may quote row values, is left out)."""
    if isinstance(exc, psycopg.Error) and exc.diag.message_primary:
        text = f"{type(exc).__name__}: {exc.diag.message_primary}"
    elif isinstance(exc, LeaseholdError):
        text = f"{type(exc).__name__}: {exc}"
    else:
        text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return text[:limit]
