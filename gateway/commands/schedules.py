"""Scheduled scans: create/list/pause/resume/delete/run-now, and the scheduler's ``claim_due``.

Each command is one transaction: lock the schedule row (``schedule_lock``), read it with a
separate statement after the lock (``schedule_read_many``), decide with :mod:`domain.schedule`,
append the events, commit. ``claim_due`` locks every due schedule it takes with ``FOR UPDATE
SKIP LOCKED`` and, in that same transaction, creates each one's scan (``ScanCreated``,
``ScanProfileSet``, the first step's job and task, exactly as :meth:`Registry.create_scan`
does) and appends ``ScheduleFired`` (or ``ScheduleSkipped``) moving ``next_run_at`` on. So any
number of Gateway processes can run the loop: a slot's scan and the schedule's advance commit
together or not at all, and a locked schedule is skipped by the other claimers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from psycopg import AsyncCursor
from psycopg_pool import AsyncConnectionPool

from domain import scan as scan_rules
from domain import schedule as rules
from domain.errors import InvalidRequest, NotFound
from domain.events import DomainEvent, MisfirePolicy, ProfileStep, ScheduleFired
from domain.schedule import ScheduleState, Timing
from gateway.commands.lifecycle import queue_step
from gateway.commands.unit_of_work import Clock, system_clock, transaction
from gateway.sql import QUERIES
from projections.store import StreamHead, append

SCHEDULER_ACTOR = "scheduler"


class Schedules:
    """Scheduled-scan commands. ``organization_id`` None means an administrator (any org)."""

    def __init__(self, pool: AsyncConnectionPool, *, clock: Clock = system_clock,
                 new_id: Callable[[], UUID] = uuid4) -> None:
        self.pool, self.clock, self.new_id = pool, clock, new_id

    async def create(self, organization_id: UUID, *, name: str, targets: dict[str, Any],
                     profile: Sequence[ProfileStep], cron: str | None = None, interval_seconds: int | None = None,
                     timezone: str = "UTC", misfire_policy: MisfirePolicy = "run_once",
                     actor: str = "system") -> UUID:
        schedule_id = self.new_id()
        timing = Timing(cron, interval_seconds, timezone)
        async with transaction(self.pool) as cur:
            await cur.execute(QUERIES["organization_exists"], {"organization_id": organization_id,
                                                               "now": self.clock()})
            row = await cur.fetchone()
            if row is None:
                raise NotFound("no such organisation", organization_id=str(organization_id))
            scan_rules.set_profile(schedule_id, 1, tuple(profile), now=row[1], actor=actor)  # validates steps
            event = rules.create(schedule_id, organization_id, name=name, timing=timing, targets=dict(targets),
                                 profile=tuple(profile), misfire_policy=misfire_policy, now=row[1], actor=actor)
            await append(cur, StreamHead(schedule_id), [event])
        return schedule_id

    async def get(self, schedule_id: UUID, *, organization_id: UUID | None = None) -> dict[str, Any]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(QUERIES["schedule_get"], {"schedule_id": schedule_id,
                                                               "organization_id": organization_id})
            row = await cur.fetchone()
            names = [c.name for c in cur.description or ()]
        if row is None:
            raise NotFound("no such schedule", schedule_id=str(schedule_id))
        return dict(zip(names, row, strict=True))

    async def list(self, *, organization_id: UUID | None = None, limit: int = 500) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(QUERIES["schedule_list"], {"organization_id": organization_id,
                                                                "limit": limit})
            rows = await cur.fetchall()
            names = [c.name for c in cur.description or ()]
        return [dict(zip(names, r, strict=True)) for r in rows]

    async def pause(self, schedule_id: UUID, *, organization_id: UUID | None = None,
                    actor: str = "system") -> None:
        await self._on_schedule(schedule_id, organization_id,
                                lambda s, now, cur: _const(rules.set_enabled(s, False, now=now, actor=actor)))

    async def resume(self, schedule_id: UUID, *, organization_id: UUID | None = None,
                     actor: str = "system") -> None:
        await self._on_schedule(schedule_id, organization_id,
                                lambda s, now, cur: _const(rules.set_enabled(s, True, now=now, actor=actor)))

    async def delete(self, schedule_id: UUID, *, organization_id: UUID | None = None,
                     actor: str = "system") -> None:
        await self._on_schedule(schedule_id, organization_id,
                                lambda s, now, cur: _const(rules.delete(s, now=now, actor=actor)))

    async def run_now(self, schedule_id: UUID, *, organization_id: UUID | None = None,
                      actor: str = "system") -> UUID:
        """Create one scan of the schedule now (paused schedules too); ``next_run_at`` unchanged."""
        scan_id = self.new_id()

        async def decide(s: ScheduleState, now: datetime, cur: AsyncCursor[Any]) -> list[DomainEvent]:
            await create_scan_in(cur, scan_id, s, now=now, actor=actor, new_id=self.new_id)
            return [rules.run_now(s, scan_id=scan_id, now=now, actor=actor)]

        await self._on_schedule(schedule_id, organization_id, decide)
        return scan_id

    async def claim_due(self, limit: int = 100) -> int:
        """Handle up to ``limit`` due schedules in ONE transaction; returns how many were handled."""
        async with transaction(self.pool) as cur:
            await cur.execute(QUERIES["schedule_claim_due"], {"now": self.clock(), "limit": limit})
            locked = await cur.fetchall()
            if not locked:
                return 0
            now = locked[0][1]
            schedules = await _read(cur, [r[0] for r in locked])
            handled = 0
            for s, head in schedules:
                scan_id = self.new_id()
                event = rules.on_due(s, scan_id=scan_id, now=now, actor=SCHEDULER_ACTOR)
                if event is None:
                    continue
                if isinstance(event, ScheduleFired):
                    await create_scan_in(cur, scan_id, s, now=now, actor=SCHEDULER_ACTOR, new_id=self.new_id)
                await append(cur, head, [event])
                handled += 1
        return handled

    async def _on_schedule(self, schedule_id: UUID, organization_id: UUID | None, decide: Any) -> None:
        async with transaction(self.pool) as cur:
            await cur.execute(QUERIES["schedule_lock"], {"schedule_id": schedule_id,
                                                         "organization_id": organization_id,
                                                         "now": self.clock()})
            locked = await cur.fetchone()
            if locked is None:
                raise NotFound("no such schedule", schedule_id=str(schedule_id))
            now = locked[1]
            ((s, head),) = await _read(cur, [schedule_id])
            events = await decide(s, now, cur)
            await append(cur, head, events)


async def _const(events: list[DomainEvent]) -> list[DomainEvent]:
    return events


async def _read(cur: AsyncCursor[Any], ids: list[UUID]) -> list[tuple[ScheduleState, StreamHead]]:
    """The locked schedules, read by a statement of their own after the lock, in lock order."""
    await cur.execute(QUERIES["schedule_read_many"], {"ids": ids})
    rows = {r[0]: r for r in await cur.fetchall()}
    out = []
    for sid in ids:
        (id_, version, org, name, cron, interval, tz, targets, profile, enabled, policy, next_run_at, deleted,
         head_hash) = rows[sid]
        state = ScheduleState(
            id=id_, version=version, organization_id=org, name=name, timing=Timing(cron, interval, tz),
            targets=targets, profile=tuple(ProfileStep(**step) for step in profile["steps"]), enabled=enabled,
            misfire_policy=policy, next_run_at=next_run_at, deleted=deleted)
        out.append((state, StreamHead(id_, version, bytes(head_hash))))
    return out


async def create_scan_in(cur: AsyncCursor[Any], scan_id: UUID, s: ScheduleState, *, now: datetime, actor: str,
                         new_id: Callable[[], UUID]) -> StreamHead:
    """Append a new scan with the schedule's profile and queue its first step, inside the
    caller's transaction: the same events :meth:`Registry.create_scan` appends."""
    if not s.profile:
        raise InvalidRequest("the schedule has no profile")
    events: list[DomainEvent] = [
        scan_rules.create_scan(scan_id, s.organization_id, dict(s.targets), "gateway", now=now, actor=actor),
        scan_rules.set_profile(scan_id, 1, s.profile, now=now, actor=actor),
    ]
    head = await append(cur, StreamHead(scan_id), events)
    await queue_step(cur, head, s.organization_id, 0, s.profile[0], dict(s.targets), now=now, actor=actor,
                     new_id=new_id)
    return head
