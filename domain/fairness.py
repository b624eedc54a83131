"""Fair shares: which organisation a shared worker serves next.

A worker assigned to several organisations leases the next task by these rules, in order:

1. **Priority first.** The highest task priority among all of the worker's organisations wins,
   whichever organisation it belongs to. Fairness never reorders priorities.
2. **Then the organisation with the least service** (start-time fair queueing). Each
   organisation has a *virtual time*: every lease it is granted adds ``1 / weight`` (weight 1
   unless an administrator sets one), so an organisation of weight 2 gets twice the leases of
   one of weight 1 while both have work. Among the organisations whose best eligible task has
   the top priority, the one with the smallest *tag* is served, where

       tag = max(virtual_time, floor),   floor = max(virtual time of the eligible) - max(1 / weight of the eligible)

   The floor is what keeps an organisation that comes back from idle (or that is new) from
   claiming its whole idle period as a backlog of service: it re-enters one quantum behind the
   most-served organisation that has work, so it is served next but cannot hold the worker for
   more than its share.
3. **Then the oldest task** (``created_at``), then the organisation id, so the order is total.

After the lease the served organisation's virtual time becomes ``tag + 1 / weight`` (computed
by the database on the row's latest value, so concurrent leases on other workers are never
lost). Acquirers running at the same moment choose from the same snapshot, so they would all
pick the same organisation; each serves it only while its virtual time, as the database holds
it when the lease is counted, has not passed the tag of the next organisation in line (the
choice's ``ceiling``), and otherwise goes on to that one. Without this, a burst of concurrent
leases would put the organisation that wins ties several quanta ahead, and the floor would then
forgive the others that lag. An organisation at its cap of live attempts, or without an eligible task for this
worker, is not eligible and its virtual time does not move.

Bound (checked by the property tests): while organisation X stays eligible at the top
priority, the other organisations are granted at most :func:`max_wait_leases` leases before X
gets one: each other organisation Y at most ``floor(q * w_Y) + 1`` of them, where ``q`` is the
largest ``1 / weight`` of the organisations involved.

With fairness off, rule 2 is skipped: priority, then the oldest task of any organisation
(the order acquisition had before fair shares).

Pure: no I/O. The Gateway reads the candidates (one row per eligible organisation) and locks a
task of the organisations in :func:`preference` order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from uuid import UUID

from leasehold.domain.errors import InvalidRequest
from leasehold.domain.events import (
    AttemptFailed,
    AttemptRevoked,
    AttemptTimedOut,
    DomainEvent,
    FairShareCandidate,
    FairShareGrant,
    LeaseExpired,
    OrganizationFairShareSet,
    TaskCancelled,
    TaskCompleted,
)

#: Limits of the operator settings (the database checks them too).
MAX_WEIGHT = 1000
MAX_CAP = 1_000_000


@dataclass(frozen=True, slots=True)
class Candidate:
    """One organisation of the worker with an eligible task, as acquisition sees it."""

    organization_id: UUID
    priority: int  # of its best eligible task
    created_at: datetime  # of that task
    virtual_time: float
    weight: int
    live: int = 0
    max_live_attempts: int | None = None


#: The ceiling of the last organisation in line: none.
NO_CEILING = 1e300


@dataclass(frozen=True, slots=True)
class Choice:
    """A candidate with the tag that ranked it (``tag + quantum`` is its next virtual time), and
    the tag of the next organisation in line at the same priority (``ceiling``): concurrent
    acquirers that chose it from one snapshot serve it only while its virtual time, as the
    database holds it at the lease, has not passed that ceiling."""

    candidate: Candidate
    tag: float
    floor: float
    ceiling: float = NO_CEILING

    @property
    def quantum(self) -> float:
        return 1.0 / self.candidate.weight


def floor_of(candidates: Sequence[Candidate]) -> float:
    """The lowest tag an eligible organisation can have (see the module's rule 2)."""
    return max(c.virtual_time for c in candidates) - max(1.0 / c.weight for c in candidates)


def preference(candidates: Iterable[Candidate], *, fair: bool = True) -> list[Choice]:
    """The candidates (organisations at their cap left out), most deserving first."""
    eligible = [c for c in candidates if c.max_live_attempts is None or c.live < c.max_live_attempts]
    if not eligible:
        return []
    floor = floor_of(eligible)
    choices = [Choice(c, max(c.virtual_time, floor), floor) for c in eligible]
    if not fair:
        choices.sort(key=lambda ch: (-ch.candidate.priority, ch.candidate.created_at, ch.candidate.organization_id))
        return choices
    choices.sort(key=lambda ch: (-ch.candidate.priority, ch.tag, ch.candidate.created_at,
                                 ch.candidate.organization_id))
    for i, (choice, after) in enumerate(zip(choices, choices[1:], strict=False)):
        if after.candidate.priority == choice.candidate.priority:
            choices[i] = replace(choice, ceiling=after.tag)
    return choices


def next_virtual_time(virtual_time: float, floor: float, weight: int) -> float:
    """The served organisation's virtual time after one lease (the database computes the same)."""
    return max(virtual_time, floor) + 1.0 / weight


def max_wait_leases(waiting: UUID, weights: dict[UUID, int]) -> int:
    """How many leases, at most, the other organisations of ``weights`` are granted in a row
    while ``waiting`` has an eligible task at the top priority."""
    q = max(1.0 / w for w in weights.values())
    return sum(math.floor(q * w + 1e-9) + 1 for org, w in weights.items() if org != waiting)


def validate_weight(weight: int) -> None:
    if not 1 <= weight <= MAX_WEIGHT:
        raise InvalidRequest(f"weight must be between 1 and {MAX_WEIGHT}")


def validate_cap(cap: int | None) -> None:
    if cap is not None and not 1 <= cap <= MAX_CAP:
        raise InvalidRequest(f"max_live_attempts must be between 1 and {MAX_CAP}, or null (no cap)")


def set_fair_share(organization_id: UUID, version: int, current: tuple[int, int | None], weight: int,
                   max_live_attempts: int | None, *, now: datetime, actor: str) -> list[OrganizationFairShareSet]:
    """The organisation's weight and cap (absolute values); nothing when they are already so."""
    validate_weight(weight)
    validate_cap(max_live_attempts)
    if current == (weight, max_live_attempts):
        return []
    return [OrganizationFairShareSet(originator_id=organization_id, originator_version=version + 1, timestamp=now,
                                     actor=actor, weight=weight, max_live_attempts=max_live_attempts)]


def grant_record(choice: Choice, candidates: Sequence[Candidate], *, virtual_time: float, live: int,
                 waited_seconds: float) -> FairShareGrant:
    """What the lease event records of the decision: enough to explain it after the fact."""
    c = choice.candidate
    return FairShareGrant(
        organization_id=c.organization_id, tag=choice.tag, floor=choice.floor, virtual_time=virtual_time,
        weight=c.weight, live=live, max_live_attempts=c.max_live_attempts, waited_seconds=waited_seconds,
        eligible=tuple(FairShareCandidate(organization_id=e.organization_id, priority=e.priority,
                                          virtual_time=e.virtual_time, weight=e.weight, live=e.live,
                                          max_live_attempts=e.max_live_attempts) for e in candidates))


#: The events that can end a live attempt; :func:`ends_attempt` says which do.
ATTEMPT_ENDING_EVENTS: tuple[type[DomainEvent], ...] = (
    TaskCompleted, AttemptFailed, LeaseExpired, AttemptTimedOut, AttemptRevoked, TaskCancelled)


def ends_attempt(event: DomainEvent) -> bool:
    """Whether ``event`` ends a live attempt, which then stops counting against its organisation's
    cap (a cancellation ends one only when it names the attempt: a pending task has none)."""
    if isinstance(event, TaskCancelled):
        return event.attempt_id is not None
    return isinstance(event, ATTEMPT_ENDING_EVENTS)
