"""Admission caps in the creating transaction: many racing creators never pass a cap (tasks,
scans, stored-profile runs), a refusal writes nothing, a lease frees room, a schedule's slot
over the cap is skipped with its reason, and the log re-derives every decision and rebuilds the
projections."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import pytest
from psycopg_pool import AsyncConnectionPool

from leasehold.domain.admission import AdmissionRefused
from leasehold.domain.errors import InvalidRequest
from leasehold.domain.events import ProfileStep
from leasehold.gateway.commands.lifecycle import TaskSpec
from leasehold.gateway.commands.schedules import Schedules
from leasehold.persistence.connection import connect
from leasehold.persistence.transaction import Database
from leasehold.replay.admission import admission_decisions, admission_violations
from support.core import ManualClock, World, assert_log_rebuilds_live, event_count

TARGETS = {"targets": ["10.0.0.1"]}
PROFILE = (ProfileStep(task_type="probe"),)
RACERS = 24


async def outcomes(*creations: Any) -> tuple[int, int]:
    """How many of the racing creations succeeded and how many were refused (nothing else)."""
    results = await asyncio.gather(*creations, return_exceptions=True)
    others = [r for r in results if isinstance(r, BaseException) and not isinstance(r, AdmissionRefused)]
    assert others == []
    refused = sum(isinstance(r, AdmissionRefused) for r in results)
    return len(results) - refused, refused


async def test_racing_task_creators_never_pass_the_cap(world: World, database_url: str) -> None:
    scans = [await world.scans.create_scan(world.org, TARGETS) for _ in range(4)]
    queued = (await world.registry.admission(world.org)).queued_tasks  # type: ignore[union-attr]
    cap = queued + 5
    await world.registry.set_admission(world.org, max_queued_tasks=cap, max_queued_scans=None, reason="racing")
    spec = TaskSpec(task_type="probe", lease_seconds=60, execution_timeout_seconds=600)

    assert await outcomes(*(world.lifecycle.create_task(scans[i % 4], spec) for i in range(RACERS))) == (
        5, RACERS - 5)
    assert (await world.registry.admission(world.org)).queued_tasks == cap  # type: ignore[union-attr]

    events = await event_count(world.pool)
    with pytest.raises(AdmissionRefused) as refused:
        await world.task(scan=scans[0])
    assert (refused.value.status, refused.value.details["retry_after"]) == (429, 30)
    assert await event_count(world.pool) == events

    worker = await world.worker(capacity=2)
    assert await world.lifecycle.acquire(worker) is not None  # a lease takes two tasks out of the queue
    assert await world.lifecycle.acquire(worker) is not None
    assert await outcomes(*(world.lifecycle.create_task(scans[i % 4], spec) for i in range(RACERS))) == (
        2, RACERS - 2)
    assert (await world.registry.admission(world.org)).queued_tasks == cap  # type: ignore[union-attr]

    async with await connect(database_url) as conn:
        assert await admission_violations(conn) == []
        decisions = [d for d in await admission_decisions(conn) if d.kind == "task" and d.cap is not None]
    assert len(decisions) == 7 and [d.queued_before for d in decisions] == [*range(queued, cap), cap - 2, cap - 1]
    await assert_log_rebuilds_live(database_url)


async def test_racing_scan_creators_and_profile_runs_never_pass_the_cap(world: World, database_url: str) -> None:
    await world.services.profiles.create(world.org, name="baseline", steps=PROFILE)
    open_scans = (await world.registry.admission(world.org)).queued_scans  # type: ignore[union-attr]
    await world.registry.set_admission(world.org, max_queued_tasks=None, max_queued_scans=open_scans + 3,
                                       reason="racing")
    creations = [world.scans.create_scan(world.org, TARGETS, profile_name="baseline" if i % 2 else None)
                 for i in range(RACERS)]
    assert await outcomes(*creations) == (3, RACERS - 3)
    assert (await world.registry.admission(world.org)).queued_scans == open_scans + 3  # type: ignore[union-attr]

    await world.registry.set_admission(world.org, max_queued_tasks=None, max_queued_scans=0, reason="intake paused")
    with pytest.raises(AdmissionRefused):
        await world.scans.create_scan(world.org, TARGETS)
    # Legacy-executed scans run elsewhere: not counted, never refused.
    await world.scans.create_scan(world.org, TARGETS, execution_mode="legacy")
    async with await connect(database_url) as conn:
        assert await admission_violations(conn) == []
    await assert_log_rebuilds_live(database_url)


async def test_a_schedules_slot_over_the_cap_is_skipped_with_its_reason(
        world: World, pool: AsyncConnectionPool, clock: ManualClock, database_url: str) -> None:
    schedules = Schedules(Database(pool), clock=clock)
    refusals: list[None] = []
    schedules.on_admission_refused = lambda: refusals.append(None)
    sid = await schedules.create(world.org, name="hourly", targets=TARGETS, profile=PROFILE, interval_seconds=3600)
    open_scans = (await world.registry.admission(world.org)).queued_scans  # type: ignore[union-attr]
    await world.registry.set_admission(world.org, max_queued_tasks=None, max_queued_scans=open_scans,
                                       reason="full")
    clock.advance(3600)
    assert await schedules.claim_due() == 1
    assert refusals == [None]
    skipped = await _schedule_events(pool, sid, "%ScheduleSkipped")
    assert len(skipped) == 1 and "admission cap" in skipped[0]["reason"] and skipped[0]["slots"] == 1
    assert await _schedule_events(pool, sid, "%ScheduleFired") == []
    assert (await world.registry.admission(world.org)).queued_scans == open_scans  # type: ignore[union-attr]

    await world.registry.set_admission(world.org, max_queued_tasks=None, max_queued_scans=None, reason="room")
    clock.advance(3600)
    assert await schedules.claim_due() == 1
    assert len(await _schedule_events(pool, sid, "%ScheduleFired")) == 1
    with pytest.raises(InvalidRequest):
        await world.registry.set_admission(world.org, max_queued_tasks=1, max_queued_scans=None, reason=" ")
    await assert_log_rebuilds_live(database_url)


async def _schedule_events(pool: AsyncConnectionPool, schedule_id: UUID, topic: str) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT convert_from(state, 'UTF8')::jsonb FROM events WHERE originator_id = %s"
            " AND topic LIKE %s ORDER BY originator_version", (schedule_id, topic))
        return [r[0] for r in await cur.fetchall()]
