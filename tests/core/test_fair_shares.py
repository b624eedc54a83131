"""Fair shares between a shared worker's organisations, and per-organisation caps, on the real
database: the order acquisition serves organisations in (the same as the pure rule of
domain/fairness.py), the caps under fifty racing acquirers on fifty connections, and the live
counters kept exact by every way an attempt ends."""

from __future__ import annotations

import asyncio
import random
from typing import Any
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from leasehold.domain import fairness
from leasehold.domain.errors import LeaseholdError
from leasehold.domain.events import TaskLeased
from leasehold.gateway.services import build_services
from leasehold.persistence.connection import connect, create_pool
from leasehold.persistence.transaction import Database
from leasehold.replay.fairness import fair_share_differences
from support.core import ManualClock, World, assert_log_rebuilds_live, rows, tenant


async def queue(world: World, scan: UUID, n: int, **spec: Any) -> None:
    for _ in range(n):
        world.clock.advance(0.001)  # each task its own creation time: the order of age is total
        await world.task(scan=scan, **spec)


async def served_orgs(world: World, worker: UUID, n: int) -> list[UUID]:
    orgs = []
    for _ in range(n):
        acquired = await world.lifecycle.acquire(worker)
        assert acquired is not None
        orgs.append(acquired.task.organization_id)
    return orgs


async def live_counts(pool: Any) -> tuple[dict[UUID, int], dict[UUID, int]]:
    """(the organisations' live counters, their attempts actually live)."""
    counters = dict(await rows(pool, "SELECT organization_id, live FROM org_service"))
    actual = dict(await rows(pool, "SELECT t.organization_id, count(*) FROM worker_task_attempts a"
                                   " JOIN worker_tasks t ON t.id = a.task_id"
                                   " WHERE a.status IN ('leased', 'running') GROUP BY t.organization_id"))
    return ({o: n for o, n in counters.items() if n}, actual)


async def test_a_flooded_organisation_does_not_starve_the_others(world: World) -> None:
    worker = await world.worker(capacity=100)
    a = world.org
    await queue(world, world.scan, 20)
    b, b_scan = await tenant(world, "b", worker)
    c, c_scan = await tenant(world, "c", worker)
    await queue(world, b_scan, 3)
    await queue(world, c_scan, 3)
    first = await served_orgs(world, worker, 9)
    assert sorted(first.count(o) for o in (a, b, c)) == [3, 3, 3]


async def test_with_fair_shares_off_the_oldest_task_goes_first(database_url: str, pool: Any) -> None:
    clock = ManualClock()
    services = build_services(Database(pool), clock=clock, fair_shares=False)
    org = await services.registry.create_organization("a")
    world = World(services, clock, org, await services.scans.create_scan(org, {"targets": ["192.0.2.10"]}))
    worker = await world.worker(capacity=100)
    await queue(world, world.scan, 10)
    b, b_scan = await tenant(world, "b", worker)
    await queue(world, b_scan, 3)
    assert await served_orgs(world, worker, 13) == [org] * 10 + [b] * 3


async def test_with_fair_shares_off_priority_still_comes_first(database_url: str, pool: Any) -> None:
    """Fairness off skips only the least-served rule: the most urgent task of any organisation is
    still leased first, however old the other organisations' tasks are."""
    clock = ManualClock()
    services = build_services(Database(pool), clock=clock, fair_shares=False)
    org = await services.registry.create_organization("a")
    world = World(services, clock, org, await services.scans.create_scan(org, {"targets": ["192.0.2.10"]}))
    worker = await world.worker(capacity=100)
    await queue(world, world.scan, 3)  # the oldest tasks, at priority 0
    b, b_scan = await tenant(world, "b", worker)
    await queue(world, b_scan, 2, priority=5)
    c, c_scan = await tenant(world, "c", worker)
    await queue(world, c_scan, 1, priority=2)
    assert await served_orgs(world, worker, 6) == [b, b, c, org, org, org]


async def test_weights_divide_the_leases(world: World) -> None:
    worker = await world.worker(capacity=100)
    a = world.org
    b, b_scan = await tenant(world, "b", worker)
    await world.registry.set_fair_share(a, weight=3, max_live_attempts=None)
    await queue(world, world.scan, 30)
    await queue(world, b_scan, 30)
    first = await served_orgs(world, worker, 20)
    assert abs(first.count(a) - 15) <= 1 and abs(first.count(b) - 5) <= 1


async def test_priority_comes_before_fairness(world: World) -> None:
    worker = await world.worker(capacity=100)
    a = world.org
    b, b_scan = await tenant(world, "b", worker)
    await queue(world, world.scan, 5)
    await served_orgs(world, worker, 3)  # a is now well ahead of b in service
    await queue(world, b_scan, 3)
    await world.task(priority=7)  # a's urgent task
    assert await served_orgs(world, worker, 2) == [a, b]


async def test_the_lease_event_records_the_decision(world: World, pool: Any) -> None:
    worker = await world.worker(capacity=100)
    b, b_scan = await tenant(world, "b", worker)
    await queue(world, world.scan, 2)
    await queue(world, b_scan, 1)
    seen: list[TaskLeased] = []
    world.lifecycle.observe = lambda events: seen.extend(e for e in events if isinstance(e, TaskLeased))
    await served_orgs(world, worker, 2)
    grant = seen[1].fair_share
    assert grant is not None
    assert grant.organization_id == b  # a was served first (oldest task at equal tags), then b
    assert {e.organization_id for e in grant.eligible} == {world.org, b}
    assert grant.virtual_time == 1.0 and grant.live == 1 and grant.weight == 1
    assert await rows(pool, "SELECT virtual_time, served, live FROM org_service WHERE organization_id = %s",
                      b) == [(1.0, 1, 1)]
    await assert_log_rebuilds_live(world.services.db.pool.conninfo)


async def test_sql_serves_organisations_in_the_order_of_the_pure_rule(world: World) -> None:
    """Random weights and arrivals: the organisations the database leases to, in order, are those
    the pure rule picks on the same history."""
    rng = random.Random(11)
    worker = await world.worker(capacity=1000)
    orgs = [(world.org, world.scan)] + [await tenant(world, f"o{i}", worker) for i in range(3)]
    weights = {org: rng.randint(1, 4) for org, _ in orgs}
    for org, weight in weights.items():
        await world.registry.set_fair_share(org, weight=weight, max_live_attempts=None)
    model = {org: [0.0, 0] for org in weights}  # virtual time, queued
    for _round in range(6):
        for org, scan in orgs:
            n = rng.randint(0, 4)
            await queue(world, scan, n)
            model[org][1] += n
        for _ in range(rng.randint(1, 6)):
            candidates = [fairness.Candidate(org, 0, world.clock.now, vt, weights[org])
                          for org, (vt, queued) in model.items() if queued]
            order = fairness.preference(candidates)
            acquired = await world.lifecycle.acquire(worker)
            if not order:
                assert acquired is None
                continue
            assert acquired is not None
            # Ties (equal tags) go to the older task; the model's tasks all share one time, so
            # the database's choice must be one of those the model ranks first at that tag.
            best = [c.candidate.organization_id for c in order if c.tag == order[0].tag]
            org = acquired.task.organization_id
            assert org in best
            choice = next(c for c in order if c.candidate.organization_id == org)
            model[org][0] = fairness.next_virtual_time(model[org][0], choice.floor, weights[org])
            model[org][1] -= 1
    state = dict(await rows(world.pool, "SELECT organization_id, virtual_time FROM org_service"))
    assert {o: v for o, v in state.items() if v} == {o: m[0] for o, m in model.items() if m[0]}


async def test_concurrent_acquirers_do_not_all_serve_the_same_organisation(world: World) -> None:
    """Acquirers at the same moment read the same state; without the ceiling each would serve
    the organisation that wins the tie, and that one would pull ahead of its share."""
    workers = [await world.worker(capacity=100) for _ in range(6)]
    orgs = [(world.org, world.scan)] + [await tenant(world, f"t{i}", *workers) for i in range(2)]
    for _, scan in orgs:
        await queue(world, scan, 40)
    served: list[UUID] = []
    for _round in range(6):
        leases = await asyncio.gather(*(world.lifecycle.acquire(w) for w in workers))
        served += [a.task.organization_id for a in leases if a is not None]
    assert len(served) == 36
    assert all(10 <= served.count(org) <= 14 for org, _ in orgs), [served.count(org) for org, _ in orgs]


async def test_a_cap_stops_leases_until_an_attempt_ends(world: World) -> None:
    worker = await world.worker(capacity=100)
    a = world.org
    b, b_scan = await tenant(world, "b", worker)
    await world.registry.set_fair_share(a, weight=1, max_live_attempts=2)
    await queue(world, world.scan, 5)
    await queue(world, b_scan, 3)
    leased = []
    while (got := await world.lifecycle.acquire(worker)) is not None:
        leased.append(got)
    assert sorted(x.task.organization_id == a for x in leased) == [False] * 3 + [True] * 2
    first_a = next(x for x in leased if x.task.organization_id == a)
    await world.lifecycle.fail(worker, first_a.task.id, first_a.attempt.id, first_a.lease_token, error="x",
                               retryable=False)
    again = await world.lifecycle.acquire(worker)
    assert again is not None and again.task.organization_id == a
    assert await world.lifecycle.acquire(worker) is None
    state = await world.registry.fair_share(a)
    assert state is not None and (state.live, state.served, state.max_live_attempts) == (2, 3, 2)


async def test_every_attempt_end_releases_its_organisations_count(world: World, pool: Any) -> None:
    lc, clock = world.lifecycle, world.clock
    w = await world.worker(capacity=50)

    async def check() -> None:
        counters, actual = await live_counts(pool)
        assert counters == actual
        world.scan = await world.scans.create_scan(world.org, {"targets": ["192.0.2.10"]})  # a scan that is open

    await check()

    done = await world.running(w)  # completed
    await world.final_batch(w, done)
    await lc.complete(w, done.task.id, done.attempt.id, done.lease_token)
    await check()
    retry = await world.leased(w)  # fails, retryable, then again terminally
    await lc.fail(w, retry.task.id, retry.attempt.id, retry.lease_token, error="boom")
    await check()
    terminal = await world.leased(w)
    await lc.fail(w, terminal.task.id, terminal.attempt.id, terminal.lease_token, error="x", retryable=False)
    await check()
    expiring = await world.leased(w, lease_seconds=5)  # lease runs out
    await check()
    late = await world.running(w, lease_seconds=3600, execution_timeout_seconds=20)  # deadline passes
    clock.advance(30)
    assert await lc.exceed_deadlines() == 1  # late (its lease ends with its deadline)
    assert await lc.expire_leases() == 1  # expiring
    await check()
    clock.advance(600)  # past the retry backoff: the failed and expired tasks are leased again
    while await lc.acquire(w) is not None:
        pass
    await check()
    acked = await world.running(w)  # cancelled, acknowledged by the worker
    await lc.request_cancel(acked.task.id)
    await lc.acknowledge_cancel(w, acked.task.id, acked.attempt.id, acked.lease_token)
    await check()
    overdue = await world.leased(w)  # cancelled, never acknowledged: the sweeper ends it
    await lc.request_cancel(overdue.task.id)
    clock.advance(31)
    await lc.terminate_cancelling()
    await check()
    pending = await world.task()  # cancelled before any lease: no attempt, nothing to release
    await lc.request_cancel(pending)
    await check()
    revoked = await world.leased(w)  # the worker revoked: its attempts are cancelled
    await world.registry.revoke_worker(w, reason="key leak")
    await lc.cancel_worker_attempts(w, reason="revoked", actor="operator")
    clock.advance(31)
    await lc.terminate_cancelling()
    await check()
    del expiring, late, revoked
    counters, actual = await live_counts(pool)
    assert counters == actual == {}
    await assert_log_rebuilds_live(pool.conninfo)
    async with await connect(pool.conninfo) as conn:
        assert await fair_share_differences(conn) == []  # the state follows from the log
        await conn.execute("UPDATE org_service SET live = live + 1")  # and a drift is seen
        await conn.commit()
        assert len(await fair_share_differences(conn)) == 1


async def test_fifty_acquirers_on_fifty_connections_never_exceed_a_cap(database_url: str) -> None:
    cap, acquirers, rounds = 4, 50, 4
    pool: AsyncConnectionPool[Any] = create_pool(database_url, min_size=acquirers, max_size=acquirers + 2)
    await pool.open(wait=True)
    try:
        clock = ManualClock()
        services = build_services(Database(pool), clock=clock, rng=random.Random(5))
        org = await services.registry.create_organization("capped")
        world = World(services, clock, org, await services.scans.create_scan(org, {"targets": ["192.0.2.10"]}))
        other, other_scan = await tenant(world, "uncapped")
        workers = [await world.worker(capacity=2) for _ in range(acquirers)]
        for worker in workers:
            await world.registry.assign_worker(worker, other)
        await world.registry.set_fair_share(org, weight=1, max_live_attempts=cap)
        await queue(world, world.scan, 60)
        peak, stop = 0, asyncio.Event()

        async def watch() -> None:  # the capped organisation's live attempts, sampled meanwhile
            nonlocal peak
            while not stop.is_set():
                ((n,),) = await rows(pool, "SELECT count(*) FROM worker_task_attempts a JOIN worker_tasks t"
                                           " ON t.id = a.task_id WHERE t.organization_id = %s"
                                           " AND a.status IN ('leased', 'running')", org)
                peak = max(peak, n)
                await asyncio.sleep(0)

        async def acquirer(worker: UUID) -> list[Any]:
            got = []
            for _ in range(rounds):
                a = await world.lifecycle.acquire(worker)
                if a is not None and a.task.organization_id == org:
                    got.append(a)
                    # end it at once, concurrently with the others' acquires
                    await world.lifecycle.fail(worker, a.task.id, a.attempt.id, a.lease_token, error="x",
                                               retryable=False)
                elif a is not None:
                    got.append(a)
            return got

        watcher = asyncio.create_task(watch())
        first = await asyncio.gather(*(world.lifecycle.acquire(w) for w in workers))
        first_capped = [a for a in first if a is not None and a.task.organization_id == org]
        assert len(first_capped) == cap  # fifty at once for the only organisation with work: the cap, no more
        await queue(world, other_scan, 40)  # from now on the capped organisation shares the workers
        for a in first_capped:
            await world.lifecycle.fail(a.attempt.worker_id, a.task.id, a.attempt.id, a.lease_token, error="x",
                                       retryable=False)
        results = await asyncio.gather(*(acquirer(w) for w in workers), return_exceptions=True)
        stop.set()
        await watcher
        errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, LeaseholdError)]
        assert errors == []
        served = sum(1 for r in results if not isinstance(r, BaseException) for a in r if a.task.organization_id == org)
        assert served > cap  # the cap was reached and freed again and again
        assert peak <= cap
        counters, actual = await live_counts(pool)
        assert counters == actual
        async with await connect(database_url) as conn:
            assert await fair_share_differences(conn) == []
    finally:
        await pool.close()
