"""Scheduled scans: exactly one scan per due slot under racing claimers, misfire policies, cron
in a timezone across DST, the operator commands, and projections rebuilt from the log."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from psycopg_pool import AsyncConnectionPool

from domain.errors import InvalidRequest, NotFound
from domain.events import ProfileStep
from domain.schedule import Timing
from gateway.commands.schedules import Schedules
from projections.chain import verify_chains
from projections.connection import connect
from projections.rebuild import diff, fold_log, load_live
from support.core import ManualClock, World

PROFILE = (ProfileStep(task_type="probe"),)
TARGETS = {"targets": ["10.0.0.1"]}


async def scalar(pool: AsyncConnectionPool, query: str, params: Any = None) -> Any:
    async with pool.connection() as conn:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
        return row[0] if row else None


async def fired(pool: AsyncConnectionPool, schedule_id: UUID) -> list[dict[str, Any]]:
    """The ScheduleFired events of a schedule, decoded from the log."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT convert_from(state, 'UTF8')::jsonb FROM events WHERE originator_id = %s"
            " AND topic LIKE %s ORDER BY originator_version", (schedule_id, "%ScheduleFired"))
        return [r[0] for r in await cur.fetchall()]


async def next_run_at(pool: AsyncConnectionPool, schedule_id: UUID) -> datetime:
    value = await scalar(pool, "SELECT next_run_at FROM scheduled_scans WHERE id = %s", (schedule_id,))
    assert isinstance(value, datetime)
    return value


async def assert_log_rebuilds_live(database_url: str) -> None:
    async with await connect(database_url) as conn:
        async with conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            rebuilt = await fold_log(conn)
            live = await load_live(conn)
        assert diff(live, rebuilt.tables) == []
        assert await verify_chains(conn) == []


async def test_racing_claimers_create_exactly_one_scan_per_slot(world: World, pool: AsyncConnectionPool,
                                                                 clock: ManualClock, database_url: str) -> None:
    claimers = [Schedules(pool, clock=clock) for _ in range(3)]
    sid = await claimers[0].create(world.org, name="every minute", targets=TARGETS, profile=PROFILE,
                                   interval_seconds=60)
    first = await next_run_at(pool, sid)
    assert first == clock.now + timedelta(seconds=60)
    slots = 1000
    for _ in range(slots):
        clock.advance(60)
        handled = await asyncio.gather(*(c.claim_due(limit=10) for c in claimers))
        assert sum(handled) == 1
    events = await fired(pool, sid)
    per_slot = Counter(e["slot"] for e in events)
    assert len(per_slot) == slots and set(per_slot.values()) == {1}
    expected = {first + timedelta(seconds=60 * i) for i in range(slots)}
    assert {datetime.fromisoformat(s) for s in per_slot} == expected
    scans = {e["scan_id"] for e in events}
    assert len(scans) == slots
    assert await scalar(pool, "SELECT count(*) FROM scans WHERE id = ANY(%s::uuid[])", (list(scans),)) == slots
    assert await scalar(pool, "SELECT count(*) FROM worker_tasks WHERE scan_id = ANY(%s::uuid[])",
                        (list(scans),)) == slots
    assert await next_run_at(pool, sid) == clock.now + timedelta(seconds=60)
    assert await asyncio.gather(*(c.claim_due() for c in claimers)) == [0, 0, 0]
    await assert_log_rebuilds_live(database_url)


@pytest.mark.parametrize(("policy", "scans"), [("run_once", 1), ("skip", 0)])
async def test_misfire_policies(world: World, pool: AsyncConnectionPool, clock: ManualClock, policy: str,
                                scans: int) -> None:
    schedules = Schedules(pool, clock=clock)
    sid = await schedules.create(world.org, name="hourly", targets=TARGETS, profile=PROFILE,
                                 interval_seconds=3600, misfire_policy=policy)  # type: ignore[arg-type]
    start = await next_run_at(pool, sid)
    clock.now = start + timedelta(hours=10, minutes=5)  # 11 slots missed
    assert await schedules.claim_due() == 1
    assert len(await fired(pool, sid)) == scans
    nxt = await next_run_at(pool, sid)
    assert nxt > clock.now and nxt == start + timedelta(hours=11)
    assert await schedules.claim_due() == 0
    # Less than one period late: both policies run.
    clock.now = nxt + timedelta(minutes=59)
    assert await schedules.claim_due() == 1
    assert len(await fired(pool, sid)) == scans + 1


def test_cron_in_a_timezone_across_dst() -> None:
    timing = Timing("0 9 * * *", None, "Europe/Berlin")
    t = datetime(2030, 3, 29, 12, tzinfo=UTC)  # DST starts 2030-03-31 in the EU
    slots = []
    for _ in range(4):
        t = timing.next_after(t)
        slots.append(t)
    assert slots == [datetime(2030, 3, 30, 8, tzinfo=UTC), datetime(2030, 3, 31, 7, tzinfo=UTC),
                     datetime(2030, 4, 1, 7, tzinfo=UTC), datetime(2030, 4, 2, 7, tzinfo=UTC)]
    autumn = timing.next_after(datetime(2030, 10, 27, 0, tzinfo=UTC))  # DST ends 2030-10-27
    assert autumn == datetime(2030, 10, 27, 8, tzinfo=UTC)
    with pytest.raises(InvalidRequest):
        Timing("not cron", None, "UTC").validate()
    with pytest.raises(InvalidRequest):
        Timing("0 9 * * *", 60, "UTC").validate()
    with pytest.raises(InvalidRequest):
        Timing(None, 60, "Mars/Olympus").validate()


async def test_cron_schedule_fires_at_local_time(world: World, pool: AsyncConnectionPool,
                                                 clock: ManualClock) -> None:
    clock.now = datetime(2030, 3, 29, 12, tzinfo=UTC)
    schedules = Schedules(pool, clock=clock)
    sid = await schedules.create(world.org, name="daily", targets=TARGETS, profile=PROFILE,
                                 cron="0 9 * * *", timezone="Europe/Berlin")
    assert await next_run_at(pool, sid) == datetime(2030, 3, 30, 8, tzinfo=UTC)
    clock.now = datetime(2030, 3, 30, 8, tzinfo=UTC)
    assert await schedules.claim_due() == 1
    assert await next_run_at(pool, sid) == datetime(2030, 3, 31, 7, tzinfo=UTC)


async def test_pause_resume_delete_and_run_now(world: World, pool: AsyncConnectionPool, clock: ManualClock,
                                               database_url: str) -> None:
    schedules = Schedules(pool, clock=clock)
    sid = await schedules.create(world.org, name="s", targets=TARGETS, profile=PROFILE, interval_seconds=60)
    await schedules.pause(sid, organization_id=world.org)
    assert (await schedules.get(sid))["enabled"] is False
    clock.advance(600)
    assert await schedules.claim_due() == 0
    scan = await schedules.run_now(sid, organization_id=world.org)  # works while paused
    assert await scalar(pool, "SELECT organization_id FROM scans WHERE id = %s", (scan,)) == world.org
    assert [e["manual"] for e in await fired(pool, sid)] == [True]
    await schedules.resume(sid)
    assert await next_run_at(pool, sid) > clock.now  # no catch-up for slots missed while paused
    assert await schedules.claim_due() == 0
    clock.advance(60)
    assert await schedules.claim_due() == 1
    other = await world.registry.create_organization("other")
    with pytest.raises(NotFound):
        await schedules.pause(sid, organization_id=other)
    with pytest.raises(NotFound):
        await schedules.get(sid, organization_id=other)
    assert [s["id"] for s in await schedules.list(organization_id=world.org)] == [sid]
    assert await schedules.list(organization_id=other) == []
    await schedules.delete(sid, organization_id=world.org)
    clock.advance(600)
    assert await schedules.claim_due() == 0
    with pytest.raises(NotFound):
        await schedules.get(sid)
    with pytest.raises(NotFound):
        await schedules.run_now(sid)
    with pytest.raises(InvalidRequest):
        await schedules.create(world.org, name="bad", targets=TARGETS, profile=PROFILE)
    with pytest.raises(InvalidRequest):
        await schedules.create(world.org, name="bad", targets=TARGETS, profile=(), interval_seconds=60)
    await assert_log_rebuilds_live(database_url)
