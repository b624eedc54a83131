"""Scheduled scans: when a schedule runs next, and what a due schedule does (pure).

A schedule has slots: the instants of its ``cron`` expression in its ``timezone`` (wall-clock
time, so "0 9 * * *" in Europe/Berlin is 08:00 UTC in summer and 07:00 UTC in winter), or every
``interval_seconds`` counted from its first slot. ``next_run_at`` is the earliest slot not yet
handled; the schedule is *due* when ``next_run_at <= now``.

Misfire policy, for a due schedule whose missed slots are those in ``[next_run_at, now]``:

* ``run_once``: exactly one scan (for the slot ``next_run_at``) however many slots were missed;
  ``next_run_at`` moves to the first slot strictly after ``now``.
* ``skip``: when only one slot was missed (``now`` is before the slot after ``next_run_at``:
  the scheduler is less than one period late) it runs exactly like ``run_once``; when two or
  more were missed (one full period late or more) it creates no scan, records how many slots
  it dropped, and moves ``next_run_at`` to the first slot strictly after ``now``.

Either way one claim handles a schedule completely: no backlog of catch-up scans.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from leasehold.domain.errors import InvalidRequest
from leasehold.domain.events import (
    DomainEvent,
    MisfirePolicy,
    ProfileStep,
    ScheduleCreated,
    ScheduleDeleted,
    ScheduleEnabledChanged,
    ScheduleFired,
    ScheduleSkipped,
)
from leasehold.domain.limits import check_field

MIN_INTERVAL_SECONDS = 1
#: Where a cron expression is tried once when a schedule is made (a leap-year start, so that
#: "0 0 29 2 *" finds its first slot within croniter's search window).
CRON_PROBE_START = datetime(2024, 1, 1, tzinfo=UTC)
#: Counting missed cron slots stops here (a ``ScheduleSkipped`` says "at least this many").
MAX_COUNTED_SLOTS = 10_000


@dataclass(frozen=True, slots=True)
class Timing:
    """When a schedule's slots are."""

    cron: str | None
    interval_seconds: int | None
    timezone: str

    def validate(self) -> None:
        if (self.cron is None) == (self.interval_seconds is None):
            raise InvalidRequest("a schedule has exactly one of cron and interval_seconds")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise InvalidRequest(f"unknown timezone {self.timezone!r}") from exc
        if self.cron is not None and not croniter.is_valid(self.cron):
            raise InvalidRequest(f"invalid cron expression {self.cron!r}")
        if self.cron is not None:
            try:  # well-formed is not enough: "0 0 31 2 *" (February 31st) never fires
                croniter(self.cron, CRON_PROBE_START).get_next(datetime)
            except CroniterBadDateError as exc:
                raise InvalidRequest(f"the cron expression {self.cron!r} never fires") from exc
        if self.interval_seconds is not None and self.interval_seconds < MIN_INTERVAL_SECONDS:
            raise InvalidRequest(f"interval_seconds must be at least {MIN_INTERVAL_SECONDS}")

    def next_after(self, t: datetime, *, anchor: datetime | None = None) -> datetime:
        """The first slot strictly after ``t`` (interval slots are ``anchor + k * interval``;
        without an anchor the first slot is ``t + interval``). A cron expression with a year
        field may have none left: that is an :class:`InvalidRequest`, not croniter's error, so a
        request naming such a schedule is refused rather than failing."""
        if self.interval_seconds is not None:
            period = timedelta(seconds=self.interval_seconds)
            if anchor is None or anchor > t:
                return anchor if anchor is not None else t + period
            return anchor + ((t - anchor) // period + 1) * period
        assert self.cron is not None
        local = t.astimezone(ZoneInfo(self.timezone))
        try:
            nxt: datetime = croniter(self.cron, local).get_next(datetime)
        except CroniterBadDateError as exc:  # an expression bounded by a year that has passed
            raise InvalidRequest(f"the cron expression {self.cron!r} never fires after {t.isoformat()}") from exc
        return nxt.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class ScheduleState:
    id: UUID
    version: int
    organization_id: UUID
    name: str
    timing: Timing
    targets: dict[str, Any]
    profile: tuple[ProfileStep, ...]
    enabled: bool
    misfire_policy: MisfirePolicy
    next_run_at: datetime
    deleted: bool


def create(schedule_id: UUID, organization_id: UUID, *, name: str, timing: Timing, targets: dict[str, Any],
           profile: tuple[ProfileStep, ...], misfire_policy: MisfirePolicy, now: datetime,
           actor: str) -> ScheduleCreated:
    name = name.strip()
    if not 1 <= len(name) <= 200:
        raise InvalidRequest("schedule name must be 1..200 characters")
    if misfire_policy not in ("run_once", "skip"):
        raise InvalidRequest("misfire_policy is run_once or skip")
    if not profile:
        raise InvalidRequest("a schedule needs a profile of at least one step")
    timing.validate()
    check_field("targets", targets)
    return ScheduleCreated(
        originator_id=schedule_id, originator_version=1, timestamp=now, actor=actor,
        organization_id=organization_id, name=name, cron=timing.cron, interval_seconds=timing.interval_seconds,
        timezone=timing.timezone, targets=targets, profile=profile, misfire_policy=misfire_policy,
        next_run_at=timing.next_after(now))


def set_enabled(s: ScheduleState, enabled: bool, *, now: datetime, actor: str) -> list[DomainEvent]:
    """Pause or resume; no change when already so. Resuming never fires missed slots."""
    if s.enabled == enabled:
        return []
    next_run_at = s.timing.next_after(now, anchor=s.next_run_at) if enabled else s.next_run_at
    return [ScheduleEnabledChanged(originator_id=s.id, originator_version=s.version + 1, timestamp=now,
                                   actor=actor, enabled=enabled, next_run_at=next_run_at)]


def delete(s: ScheduleState, *, now: datetime, actor: str) -> list[DomainEvent]:
    return [ScheduleDeleted(originator_id=s.id, originator_version=s.version + 1, timestamp=now, actor=actor)]


def missed_slots(s: ScheduleState, now: datetime) -> int:
    """How many slots lie in ``[next_run_at, now]`` (0 when not due; capped for cron)."""
    if s.next_run_at > now:
        return 0
    if s.timing.interval_seconds is not None:
        return (now - s.next_run_at) // timedelta(seconds=s.timing.interval_seconds) + 1
    count, slot = 1, s.next_run_at
    while count < MAX_COUNTED_SLOTS:
        slot = s.timing.next_after(slot)
        if slot > now:
            break
        count += 1
    return count


def on_due(s: ScheduleState, *, scan_id: UUID, now: datetime, actor: str) -> DomainEvent | None:
    """What the scheduler does with a claimed schedule: ``ScheduleFired`` (create ``scan_id``),
    ``ScheduleSkipped`` (no scan), or None (not due, paused or deleted: nothing)."""
    if not s.enabled or s.deleted or s.next_run_at > now:
        return None
    next_run_at = s.timing.next_after(now, anchor=s.next_run_at)
    missed = missed_slots(s, now)
    if s.misfire_policy == "skip" and missed > 1:
        return ScheduleSkipped(originator_id=s.id, originator_version=s.version + 1, timestamp=now, actor=actor,
                               slots=missed, first_slot=s.next_run_at, next_run_at=next_run_at)
    return ScheduleFired(originator_id=s.id, originator_version=s.version + 1, timestamp=now, actor=actor,
                         scan_id=scan_id, slot=s.next_run_at, next_run_at=next_run_at)


def refused(fired: ScheduleFired, reason: str) -> ScheduleSkipped:
    """The due slot of ``fired`` dropped without a scan: the organisation's admission cap refused
    it (:mod:`domain.admission`); the schedule moves on as if it had fired."""
    return ScheduleSkipped(originator_id=fired.originator_id, originator_version=fired.originator_version,
                           timestamp=fired.timestamp, actor=fired.actor, slots=1, first_slot=fired.slot,
                           next_run_at=fired.next_run_at, reason=reason)


def run_now(s: ScheduleState, *, scan_id: UUID, now: datetime, actor: str) -> ScheduleFired:
    """A scan now, outside the schedule; ``next_run_at`` is unchanged."""
    return ScheduleFired(originator_id=s.id, originator_version=s.version + 1, timestamp=now, actor=actor,
                         scan_id=scan_id, slot=now, next_run_at=s.next_run_at, manual=True)
