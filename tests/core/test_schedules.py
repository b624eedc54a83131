"""Scheduled scans: exactly one scan per due slot under racing claimers, misfire policies, cron
in a timezone across DST, the operator commands, a failing schedule that must not block the
others, and projections rebuilt from the log."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from psycopg_pool import AsyncConnectionPool

from leasehold.domain.errors import InvalidRequest, NotFound
from leasehold.domain.events import ProfileStep
from leasehold.domain.profiles import LegacyExecuted
from leasehold.gateway.commands.schedules import FailureBackoff, Schedules
from leasehold.persistence.chain import verify_chains
from leasehold.persistence.connection import connect
from leasehold.persistence.snapshot import snapshot
from leasehold.persistence.tables import load_tables
from leasehold.persistence.transaction import Database
from leasehold.projections.compare import diff
from leasehold.replay.fold import fold
from support.core import ManualClock, World, assert_log_rebuilds_live
from support.locks import rows_locked, waits_while_running

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


async def test_racing_claimers_create_exactly_one_scan_per_slot(world: World, pool: AsyncConnectionPool,
                                                                 clock: ManualClock, database_url: str) -> None:
    claimers = [Schedules(Database(pool), clock=clock) for _ in range(3)]
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


async def test_a_claimer_skips_a_schedule_another_claimer_holds_instead_of_waiting(
        world: World, pool: AsyncConnectionPool, clock: ManualClock, database_url: str) -> None:
    """``FOR UPDATE SKIP LOCKED``: while another transaction holds the earliest due schedule, a
    claimer takes the others at once, waits for no lock and leaves the held one alone."""
    schedules = Schedules(Database(pool), clock=clock)
    ids = [await schedules.create(world.org, name=f"s{i}", targets=TARGETS, profile=PROFILE,
                                  interval_seconds=60 + i) for i in range(4)]
    clock.advance(120)
    held = ids[0]  # the earliest next_run_at: first in the claim's order
    async with rows_locked(database_url, "SELECT id FROM scheduled_scans WHERE id = %s FOR UPDATE",
                           (held,)) as holder:
        job, waiting = await waits_while_running(pool, holder, schedules.claim_due(limit=10))
    handled = await asyncio.wait_for(job, 10)
    assert waiting == [], f"the claim waited for the held schedule: {waiting}"
    assert handled == 3
    assert [len(await fired(pool, sid)) for sid in ids] == [0, 1, 1, 1]
    assert await schedules.claim_due(limit=10) == 1  # once let go, it is claimed as usual
    assert [len(await fired(pool, sid)) for sid in ids] == [1, 1, 1, 1]


async def test_concurrent_claimers_each_claim_distinct_schedules_without_waiting_or_failing(
        world: World, pool: AsyncConnectionPool, clock: ManualClock, database_url: str) -> None:
    """Eight claimers (eight connections) at once over twenty-four due schedules, three each:
    every schedule fires exactly once, every claimer gets a share of its own, none raises, and
    no claim is ever seen waiting for another's lock."""
    claimers = [Schedules(Database(pool), clock=clock) for _ in range(8)]
    ids = [await claimers[0].create(world.org, name=f"s{i}", targets=TARGETS, profile=PROFILE,
                                    interval_seconds=60) for i in range(24)]
    clock.advance(61)
    # The claims hold their transactions open while they create scans; a watcher samples the
    # server's row-lock waits throughout. (Committing transactions that NOTIFY queue for one
    # database-wide lock, a wait on an ``object``: not a claim colliding with another.)
    seen_waiting: list[tuple[Any, ...]] = []
    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            async with pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT pid, wait_event, left(query, 120) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0"
                    " AND wait_event_type = 'Lock' AND wait_event IN ('tuple', 'transactionid')")
                seen_waiting.extend(await cur.fetchall())
            await asyncio.sleep(0.002)  # the watch samples while the claimers race; it ends with them

    watcher = asyncio.ensure_future(watch())
    try:
        handled = await asyncio.gather(*(c.claim_due(limit=3) for c in claimers), return_exceptions=True)
    finally:
        done.set()
        await watcher
    assert not [h for h in handled if isinstance(h, BaseException)], handled
    assert handled == [3] * 8, handled
    assert seen_waiting == []
    assert [len(await fired(pool, sid)) for sid in ids] == [1] * 24
    claimed_by = await scalar(pool, "SELECT count(DISTINCT transaction_id) FROM events"
                                    " WHERE originator_id = ANY(%s::uuid[]) AND topic LIKE '%%ScheduleFired'", (ids,))
    assert claimed_by == 8  # eight transactions, three schedules each: no schedule claimed twice
    await assert_log_rebuilds_live(database_url)


@pytest.mark.parametrize(("policy", "scans"), [("run_once", 1), ("skip", 0)])
async def test_misfire_policies(world: World, pool: AsyncConnectionPool, clock: ManualClock, policy: str,
                                scans: int) -> None:
    schedules = Schedules(Database(pool), clock=clock)
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


async def test_cron_schedule_fires_at_local_time(world: World, pool: AsyncConnectionPool,
                                                 clock: ManualClock) -> None:
    clock.now = datetime(2030, 3, 29, 12, tzinfo=UTC)
    schedules = Schedules(Database(pool), clock=clock)
    sid = await schedules.create(world.org, name="daily", targets=TARGETS, profile=PROFILE,
                                 cron="0 9 * * *", timezone="Europe/Berlin")
    assert await next_run_at(pool, sid) == datetime(2030, 3, 30, 8, tzinfo=UTC)
    clock.now = datetime(2030, 3, 30, 8, tzinfo=UTC)
    assert await schedules.claim_due() == 1
    assert await next_run_at(pool, sid) == datetime(2030, 3, 31, 7, tzinfo=UTC)


async def test_pause_resume_delete_and_run_now(world: World, pool: AsyncConnectionPool, clock: ManualClock,
                                               database_url: str) -> None:
    schedules = Schedules(Database(pool), clock=clock)
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


POISON_TRIGGER = """
CREATE FUNCTION refuse_poisoned_scan() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'scan refused for targets %', NEW.targets;
END $$;
CREATE TRIGGER refuse_poisoned_scan BEFORE INSERT ON scans FOR EACH ROW
WHEN (NEW.targets @> '{"targets": ["10.6.6.6"]}') EXECUTE FUNCTION refuse_poisoned_scan();
"""


async def test_a_failing_schedule_does_not_block_the_others(world: World, pool: AsyncConnectionPool,
                                                             clock: ManualClock, database_url: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    backoff_now = [0.0]
    failures: list[UUID] = []
    schedules = Schedules(Database(pool), clock=clock, on_failure=failures.append,
                          backoff=FailureBackoff(initial_seconds=10, max_seconds=40, clock=lambda: backoff_now[0]))
    # The two poisoned schedules come first in the claim (earliest next_run_at), the good ones after.
    refused = await schedules.create(world.org, name="refused by the database", targets={"targets": ["10.6.6.6"]},
                                     profile=PROFILE, interval_seconds=60)
    clock.advance(1)
    unreadable = await schedules.create(world.org, name="unreadable profile", targets=TARGETS, profile=PROFILE,
                                        interval_seconds=60)
    clock.advance(1)
    good = [await schedules.create(world.org, name=f"good {i}", targets=TARGETS, profile=PROFILE,
                                   interval_seconds=60) for i in range(3)]
    slots = {sid: await next_run_at(pool, sid) for sid in (refused, unreadable, *good)}
    async with pool.connection() as conn:
        # Poison 1: the server raises inside the claim's transaction, after the scan's events
        # were appended (projections are applied after the append). Poison 2: the stored
        # profile no longer parses, so the schedule cannot even be read.
        await conn.execute(POISON_TRIGGER)
        profile = await scalar(pool, "SELECT profile FROM scheduled_scans WHERE id = %s", (unreadable,))
        await conn.execute("UPDATE scheduled_scans SET profile = %s WHERE id = %s",
                           ({"steps": [{"task_type": "probe", "no_such_field": 1}]}, unreadable))
    events_before = await scalar(pool, "SELECT count(*) FROM events")

    clock.advance(60)
    with caplog.at_level(logging.WARNING, logger="leasehold.scheduler"):
        assert await schedules.claim_due(limit=10) == 3
    assert failures == [refused, unreadable]
    for sid in good:
        assert [datetime.fromisoformat(e["slot"]) for e in await fired(pool, sid)] == [slots[sid]]
    for sid in (refused, unreadable):
        assert await fired(pool, sid) == []
        assert await next_run_at(pool, sid) == slots[sid]  # still due: nothing of it committed
    # Exactly the three good scans' events were added (3 x ScanCreated, ScanProfileSet,
    # ScanJobQueued, TaskCreated, ScheduleFired): the refused scan's appended events were undone.
    assert await scalar(pool, "SELECT count(*) FROM events") == events_before + 3 * 5
    assert await scalar(pool, "SELECT count(*) FROM scans WHERE targets @> %s",
                        ({"targets": ["10.6.6.6"]},)) == 0
    warnings = {r.schedule_id: r for r in caplog.records if hasattr(r, "schedule_id")}  # type: ignore[attr-defined]
    assert set(warnings) == {str(refused), str(unreadable)}
    assert "scan refused for targets" in warnings[str(refused)].error  # type: ignore[attr-defined]
    assert "no_such_field" in warnings[str(unreadable)].error  # type: ignore[attr-defined]
    assert warnings[str(refused)].retry_in_seconds == 10  # type: ignore[attr-defined]
    await assert_log_rebuilds_live_except_poison(database_url, unreadable)

    # Backed off: the next passes leave them alone until the backoff ends, then try again (and
    # the delay doubles while they keep failing).
    assert await schedules.claim_due(limit=10) == 0
    assert failures == [refused, unreadable]
    backoff_now[0] += 10
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="leasehold.scheduler"):
        assert await schedules.claim_due(limit=10) == 0
    assert failures == [refused, unreadable] * 2
    assert {r.retry_in_seconds for r in caplog.records if hasattr(r, "schedule_id")} == {20}  # type: ignore[attr-defined]

    # Cured: both fire for the slot they missed, once.
    async with pool.connection() as conn:
        await conn.execute("DROP TRIGGER refuse_poisoned_scan ON scans")
        await conn.execute("UPDATE scheduled_scans SET profile = %s WHERE id = %s", (profile, unreadable))
    backoff_now[0] += 19
    assert await schedules.claim_due(limit=10) == 0
    backoff_now[0] += 1
    assert await schedules.claim_due(limit=10) == 2
    for sid in (refused, unreadable):
        assert [datetime.fromisoformat(e["slot"]) for e in await fired(pool, sid)] == [slots[sid]]
    assert schedules.backoff.skipped() == []
    await assert_log_rebuilds_live(database_url)


async def assert_log_rebuilds_live_except_poison(database_url: str, unreadable: UUID) -> None:
    """Rebuild = live, but for the profile the test corrupted by hand in the projection."""
    async with await connect(database_url) as conn:
        async with snapshot(conn):
            rebuilt = await fold(conn)
            live = await load_tables(conn)
        differences = diff(live, rebuilt.tables.tables)
        assert differences and all(str(unreadable) in str(d) for d in differences), differences
        assert await verify_chains(conn) == []


async def test_schedules_of_a_legacy_executed_organisation_wait_for_the_flag(
        world: World, pool: AsyncConnectionPool, clock: ManualClock, database_url: str) -> None:
    """Rolling an organisation back to legacy execution stops its scheduled Gateway scans: due
    slots stay due (no scan, legacy or Gateway, is created for them) and "run now" is refused;
    with the flag back on, the missed slots fire once, per the misfire policy (``run_once``)."""
    backoff_now = [0.0]
    schedules = Schedules(Database(pool), clock=clock,
                          backoff=FailureBackoff(initial_seconds=10, max_seconds=40, clock=lambda: backoff_now[0]))
    sid = await schedules.create(world.org, name="nightly", targets=TARGETS, profile=PROFILE, interval_seconds=60)
    first = await next_run_at(pool, sid)
    scans_before = await scalar(pool, "SELECT count(*) FROM scans")
    await world.registry.set_gateway_execution(world.org, False)

    clock.advance(180)
    assert await schedules.claim_due(limit=10) == 0
    with pytest.raises(LegacyExecuted):
        await schedules.run_now(sid, organization_id=world.org)
    assert await scalar(pool, "SELECT count(*) FROM scans") == scans_before
    assert await next_run_at(pool, sid) == first and await fired(pool, sid) == []

    await world.registry.set_gateway_execution(world.org, True)
    backoff_now[0] += 10
    assert await schedules.claim_due(limit=10) == 1
    (event,) = await fired(pool, sid)
    assert datetime.fromisoformat(event["slot"]) == first
    assert await scalar(pool, "SELECT execution_mode FROM scans WHERE id = %s", (UUID(event["scan_id"]),)) \
        == "gateway"
    assert await next_run_at(pool, sid) > clock.now
    await assert_log_rebuilds_live(database_url)
