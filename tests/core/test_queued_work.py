"""Acquire reads only the organisations with queued work (``org_queued_work``, migration 0021):
a worker serving 200 organisations, one of them with a task, leases it reading a handful of
buffers; every queued task's organisation and type is flagged, under racing creates, leases,
completions, failures, cancels and flag clearing on many connections, and after every way a task
re-enters the queue; the sweeper's clearing leaves exactly the flags of queued work."""

from __future__ import annotations

import asyncio
import random
from typing import Any
from uuid import UUID

from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from leasehold.domain.errors import LeaseholdError
from leasehold.gateway.services import build_services
from leasehold.persistence.connection import create_pool
from leasehold.persistence.queries import QUERIES
from leasehold.persistence.transaction import Database
from support.core import ManualClock, World, rows


async def flags(pool: Any) -> tuple[set[tuple[UUID, str]], set[tuple[UUID, str]]]:
    """(the flagged organisations and task types, those with a task queued now)."""
    flagged = {(o, t) for o, t in await rows(pool, "SELECT organization_id, task_type FROM org_queued_work"
                                                   " WHERE queued UNION SELECT organization_id, task_type"
                                                   " FROM org_queued_raises")}
    queued = {(o, t) for o, t in await rows(pool, "SELECT DISTINCT organization_id, task_type FROM worker_tasks"
                                                  " WHERE state IN ('pending', 'retry_wait')")}
    return flagged, queued


async def assert_flags_cover(pool: Any) -> set[tuple[UUID, str]]:
    """Every queued task's organisation and type is flagged (more may be, until a clearing)."""
    flagged, queued = await flags(pool)
    assert queued <= flagged, queued - flagged
    return queued


async def assert_counts_exact(pool: Any, lifecycle: Any) -> set[tuple[UUID, str]]:
    """After the sweeper's clearing: exactly the flags of queued work, no raise left."""
    await lifecycle.clear_queue_flags()
    flagged, queued = await flags(pool)
    assert flagged == queued
    assert await rows(pool, "SELECT * FROM org_queued_raises") == []
    return queued


async def candidates_buffers(pool: Any, worker: UUID, now: Any) -> tuple[int, int]:
    """(rows, shared buffers) of fair_share_candidates as acquire runs it (plans pinned first)."""
    async with pool.connection() as conn:
        params = {"worker_id": worker, "now": now}
        await conn.execute("BEGIN")
        await conn.execute(QUERIES["worker_live_attempts"], params)
        cur = await conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ")
                                 + sql.SQL(QUERIES["fair_share_candidates"]), params)
        row = await cur.fetchone()
        await conn.execute("ROLLBACK")
    assert row is not None
    plan = row[0][0]["Plan"]
    return int(plan["Actual Rows"]), int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


async def test_a_worker_serving_200_organisations_leases_the_only_one_with_work_reading_few_buffers(
        world: World, pool: Any) -> None:
    worker = await world.worker()
    orgs = []
    for i in range(200):
        org = await world.registry.create_organization(f"served-{i}")
        await world.registry.assign_worker(worker, org)
        orgs.append(org)
    busy = orgs[137]
    scan = await world.scans.create_scan(busy, {"targets": ["192.0.2.10"]})
    task = await world.task(scan=scan)
    async with pool.connection() as conn:
        await conn.execute("ANALYZE")
    found, buffers = await candidates_buffers(pool, worker, world.clock())
    # The organisations served but idle are not read: a handful of buffers, not several per
    # organisation (about 8 per organisation served, ~1,600 here, when each was probed).
    assert found == 1 and buffers <= 40, buffers
    acquired = await world.lifecycle.acquire(worker)
    assert acquired is not None and acquired.task.id == task and acquired.task.organization_id == busy
    assert await world.lifecycle.acquire(worker) is None
    assert await assert_counts_exact(pool, world.lifecycle) == set()


async def test_the_counts_follow_every_way_a_task_enters_or_leaves_the_queue(world: World, pool: Any) -> None:
    lc, clock = world.lifecycle, world.clock
    w = await world.worker(capacity=50, task_types=("probe", "crawl"))
    await world.task()
    await world.task(task_type="crawl")
    assert await assert_flags_cover(pool) == {(world.org, "probe"), (world.org, "crawl")}
    a = await lc.acquire(w)  # leased: out of the queue
    b = await lc.acquire(w)
    assert a is not None and b is not None
    assert await assert_counts_exact(pool, lc) == set()
    await lc.fail(w, a.task.id, a.attempt.id, a.lease_token, error="boom")  # retry_wait: back in
    assert await assert_flags_cover(pool) == {(world.org, a.task.task_type)}
    await world.final_batch(w, b)
    await lc.complete(w, b.task.id, b.attempt.id, b.lease_token)
    assert await assert_counts_exact(pool, lc) == {(world.org, a.task.task_type)}
    clock.advance(600)
    again = await lc.acquire(w)
    assert again is not None
    assert await assert_counts_exact(pool, lc) == set()
    await world.task()
    queued = await world.task(task_type="crawl")
    await lc.request_cancel(queued)  # cancelled before a lease: out of the queue
    assert await assert_counts_exact(pool, lc) == {(world.org, "probe")}
    assert await lc.acquire(w) is not None
    expiring = await world.leased(w, lease_seconds=5)
    assert await assert_counts_exact(pool, lc) == set()
    clock.advance(6)
    assert await lc.expire_leases() == 1  # the lease ran out: queued again
    assert await assert_flags_cover(pool) == {(world.org, expiring.task.task_type)}


async def test_the_counts_stay_exact_under_racing_commands_on_many_connections(database_url: str) -> None:
    connections, workers_n, rounds = 24, 12, 12
    pool: AsyncConnectionPool[Any] = create_pool(database_url, min_size=connections, max_size=connections + 2)
    await pool.open(wait=True)
    try:
        clock = ManualClock()
        services = build_services(Database(pool), clock=clock, rng=random.Random(7))
        org = await services.registry.create_organization("first")
        world = World(services, clock, org, await services.scans.create_scan(org, {"targets": ["192.0.2.10"]}))
        other = await services.registry.create_organization("second")
        other_scan = await services.scans.create_scan(other, {"targets": ["192.0.2.11"]})
        workers = [await world.worker(capacity=3, task_types=("probe", "crawl")) for _ in range(workers_n)]
        for worker in workers:
            await world.registry.assign_worker(worker, other)
        created: list[UUID] = []

        async def creator(lane: int) -> None:
            for i in range(rounds * 2):
                created.append(await world.task(scan=(world.scan, other_scan)[(lane + i) % 2],
                                                task_type=("probe", "crawl")[i % 2]))

        async def acquirer(worker: UUID, seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(rounds):
                a = await world.lifecycle.acquire(worker)
                if a is None:
                    await asyncio.sleep(0)
                    continue
                end = rng.choice(("complete", "fail", "fail_terminal", "keep"))
                if end == "complete":
                    await world.final_batch(worker, a)
                    await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)
                elif end == "fail":
                    await world.lifecycle.fail(worker, a.task.id, a.attempt.id, a.lease_token, error="x")
                elif end == "fail_terminal":
                    await world.lifecycle.fail(worker, a.task.id, a.attempt.id, a.lease_token, error="x",
                                               retryable=False)

        async def canceller(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(rounds):
                if created:
                    await world.lifecycle.request_cancel(rng.choice(created))
                await asyncio.sleep(0)

        async def clearer() -> None:  # the sweeper's clearing, racing everything else
            for _ in range(rounds * 2):
                await world.lifecycle.clear_queue_flags()
                await asyncio.sleep(0)

        results = await asyncio.gather(*(creator(i) for i in range(4)),
                                       *(acquirer(w, i) for i, w in enumerate(workers)),
                                       *(canceller(100 + i) for i in range(3)), clearer(), clearer(),
                                       return_exceptions=True)
        unexpected = [r for r in results if isinstance(r, BaseException) and not isinstance(r, LeaseholdError)]
        assert unexpected == []
        assert len(created) > rounds
        assert await assert_flags_cover(pool) != set()  # some still queued: the flags were put to the test
        clock.advance(3600)  # the kept leases run out: back in the queue, concurrently with cancels
        raced = await asyncio.gather(world.lifecycle.expire_leases(),
                                     *(world.lifecycle.request_cancel(t) for t in created[::2]),
                                     return_exceptions=True)
        assert [r for r in raced if isinstance(r, BaseException) and not isinstance(r, LeaseholdError)] == []
        await assert_flags_cover(pool)
        for task in created:  # every task cancelled (or already finished): nothing queued
            await world.lifecycle.request_cancel(task)
        assert await assert_counts_exact(pool, world.lifecycle) == set()
    finally:
        await pool.close()


async def test_a_transaction_queueing_many_tasks_raises_its_organisation_once(world: World, pool: Any) -> None:
    """A flag that is down is raised by one row per transaction, however many tasks it queues
    (written here with SQL: two leased tasks put back in one statement)."""
    w = await world.worker(capacity=5)
    tasks = [await world.task() for _ in range(3)]
    for _ in tasks:
        assert await world.lifecycle.acquire(w) is not None
    assert await assert_counts_exact(pool, world.lifecycle) == set()  # the flag is down
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("UPDATE worker_tasks SET state = 'pending' WHERE id = ANY(%s)", (tasks,))
    assert await rows(pool, "SELECT organization_id, task_type FROM org_queued_raises") == [(world.org, "probe")]
    assert await assert_flags_cover(pool) == {(world.org, "probe")}
