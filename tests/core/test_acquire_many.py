"""Acquiring several tasks in one request (``max_tasks``), on the real database: every rule of a
one-task acquire holds per lease — the worker's capacity (counting the leases of the same
request), no task leased twice, the organisations' caps and fair-share order, one event and one
token per lease — under many acquirers racing on their own connections; and a repeated request
id returns the same attempts and leases nothing more."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any
from uuid import UUID

import pytest
from psycopg_pool import AsyncConnectionPool

from leasehold.domain.errors import InvalidRequest, LeaseholdError, LeaseLost
from leasehold.gateway.commands.lifecycle import MAX_TASKS_PER_ACQUIRE, Acquired, hash_token
from leasehold.gateway.services import build_services
from leasehold.persistence.connection import connect, create_pool
from leasehold.persistence.transaction import Database
from leasehold.replay.fairness import fair_share_differences
from support.core import ManualClock, World, assert_log_rebuilds_live, rows, tenant
from support.locks import rows_locked, waits_while_running


async def queue(world: World, scan: UUID, n: int, **spec: Any) -> list[UUID]:
    made = []
    for _ in range(n):
        world.clock.advance(0.001)  # each task its own creation time: the order of age is total
        made.append(await world.task(scan=scan, **spec))
    return made


async def live_per_worker(pool: Any) -> dict[UUID, int]:
    return dict(await rows(pool, "SELECT worker_id, count(*) FROM worker_task_attempts"
                                 " WHERE status IN ('leased', 'running') GROUP BY worker_id"))


async def test_one_request_leases_up_to_the_free_capacity_each_lease_its_own(world: World, pool: Any) -> None:
    tasks = set(await queue(world, world.scan, 6))
    worker = await world.worker(capacity=4)
    first = await world.lifecycle.acquire(worker)
    assert first is not None
    leases = await world.lifecycle.acquire_many(worker, 8)
    assert len(leases) == 3  # capacity 4, one live already: three more, not eight
    assert {a.task.id for a in leases} <= tasks - {first.task.id}
    assert len({a.attempt.id for a in leases}) == 3 and len({a.lease_token for a in leases}) == 3
    # Oldest first, as three one-task acquires would have leased them.
    assert [a.task.created_at for a in leases] == sorted(a.task.created_at for a in leases)
    # One TaskLeased event per lease, each with only its own token's hash.
    for a in leases:
        stored = await rows(pool, "SELECT lease_token_hash FROM worker_task_attempts WHERE id = %s", a.attempt.id)
        assert stored == [(bytes.fromhex(hash_token(a.lease_token)),)]
    assert await rows(pool, "SELECT count(*) FROM events WHERE topic LIKE '%%TaskLeased'") == [(4,)]
    assert await world.lifecycle.acquire_many(worker, 8) == []  # at capacity
    await assert_log_rebuilds_live(pool.conninfo)


async def test_max_tasks_is_bounded(world: World) -> None:
    worker = await world.worker(capacity=50)
    for bad in (0, MAX_TASKS_PER_ACQUIRE + 1):
        with pytest.raises(InvalidRequest):
            await world.lifecycle.acquire_many(worker, bad)
    with pytest.raises(InvalidRequest):  # its leases after the first are stored under request_id#n
        await world.lifecycle.acquire_many(worker, 2, request_id="r" * 197)


async def test_a_repeated_request_id_returns_the_same_attempts_and_leases_nothing_more(
        world: World, pool: Any) -> None:
    await queue(world, world.scan, 10)
    worker = await world.worker(capacity=10)
    leases = await world.lifecycle.acquire_many(worker, 4, request_id="req-many")
    assert len(leases) == 4
    again = await world.lifecycle.acquire_many(worker, 4, request_id="req-many")
    assert [a.attempt.id for a in again] == [a.attempt.id for a in leases]  # same attempts, same order
    assert not {a.lease_token for a in again} & {a.lease_token for a in leases}  # fresh tokens
    assert await rows(pool, "SELECT count(*) FROM worker_task_attempts") == [(4,)]
    # The old tokens were superseded, the new ones hold.
    with pytest.raises(LeaseLost):
        await world.lifecycle.renew(worker, leases[1].task.id, leases[1].attempt.id, leases[1].lease_token)
    await world.lifecycle.renew(worker, again[1].task.id, again[1].attempt.id, again[1].lease_token)
    # An attempt of the set that ended is left out of the repeat; the others come back.
    ended = again[0]
    await world.lifecycle.fail(worker, ended.task.id, ended.attempt.id, ended.lease_token, error="x",
                               retryable=False)
    third = await world.lifecycle.acquire_many(worker, 4, request_id="req-many")
    assert [a.attempt.id for a in third] == [a.attempt.id for a in leases[1:]]
    assert await rows(pool, "SELECT count(*) FROM worker_task_attempts") == [(4,)]


async def test_identical_many_requests_racing_lease_one_set(world: World, pool: Any) -> None:
    await queue(world, world.scan, 12)
    worker = await world.worker(capacity=12)
    results = await asyncio.gather(*(world.lifecycle.acquire_many(worker, 3, request_id="race")
                                     for _ in range(8)))
    assert {tuple(a.attempt.id for a in r) for r in results} == {tuple(a.attempt.id for a in results[0])}
    assert len(results[0]) == 3
    assert await rows(pool, "SELECT count(*) FROM worker_task_attempts") == [(3,)]


async def test_a_shared_worker_gets_the_fair_share_order_within_one_request(world: World) -> None:
    """Two identical pairs of organisations (weights 1 and 2), each served by its own worker: one
    worker acquires one task at a time, the other several per request; both are served the
    organisations in the same order."""
    roles: dict[UUID, str] = {}
    workers = []
    for pair in ("one", "many"):
        worker = await world.worker(capacity=20, org=(light := (await tenant(world, f"{pair}-light"))[0]))
        heavy, heavy_scan = await tenant(world, f"{pair}-heavy", worker)
        await world.registry.set_fair_share(heavy, weight=2, max_live_attempts=None)
        roles |= {light: "light", heavy: "heavy"}
        workers.append((worker, light, heavy_scan))
    for _worker, light, heavy_scan in workers:
        light_scan = await world.scans.create_scan(light, {"targets": ["192.0.2.10"]})
        await queue(world, light_scan, 6)
        await queue(world, heavy_scan, 6)
        await queue(world, light_scan, 2, priority=5)  # priority comes before fairness
    (one, *_), (many, *_) = workers
    single = [await world.lifecycle.acquire(one) for _ in range(11)]
    order = [(roles[a.task.organization_id], a.task.priority) for a in single if a is not None]
    batches, leased = [], []
    while len(leased) < 11:
        got = await world.lifecycle.acquire_many(many, 11 - len(leased))
        assert got
        batches.append(len(got))
        leased += [(roles[a.task.organization_id], a.task.priority) for a in got]
    assert leased == order
    assert order[:2] == [("light", 5), ("light", 5)] and Counter(r for r, _ in order[2:]) == {"heavy": 6, "light": 3}
    # A lease after the round's first never waits for an organisation's row, and a first-ever
    # lease of an organisation creates it: that one round may stop early, the next does not.
    assert len(batches) <= 3 and batches[-1] > 1
    await assert_log_rebuilds_live(world.pool.conninfo)


async def test_a_cap_holds_within_one_request(world: World) -> None:
    worker = await world.worker(capacity=10)
    other, other_scan = await tenant(world, "beta", worker)
    await world.registry.set_fair_share(world.org, weight=1, max_live_attempts=2)
    await queue(world, world.scan, 6)
    await queue(world, other_scan, 6)
    leases: list[Acquired] = []
    while got := await world.lifecycle.acquire_many(worker, 8):  # (a first-ever lease may end a round)
        leases += got
    served = Counter(a.task.organization_id for a in leases)
    assert served == {world.org: 2, other: 6}  # the cap, however many the requests asked for


async def test_many_workers_racing_with_max_tasks_keep_capacity_caps_and_leases_single(database_url: str) -> None:
    """Forty workers on forty connections, each acquiring up to 4 tasks per request (capacity 3)
    while ending some of them, over two organisations that share every worker (one capped):
    no worker ever holds more than its capacity, no task is leased twice at once, the cap holds
    (sampled meanwhile), nothing deadlocks, and the log rebuilds the live rows."""
    cap, acquirers, rounds, capacity = 5, 40, 4, 3
    pool: AsyncConnectionPool[Any] = create_pool(database_url, min_size=acquirers, max_size=acquirers + 2)
    await pool.open(wait=True)
    try:
        clock = ManualClock()
        services = build_services(Database(pool), clock=clock, rng=random.Random(7))
        org = await services.registry.create_organization("capped")
        world = World(services, clock, org, await services.scans.create_scan(org, {"targets": ["192.0.2.10"]}))
        other, other_scan = await tenant(world, "uncapped")
        workers = [await world.worker(capacity=capacity) for _ in range(acquirers)]
        for worker in workers:
            await world.registry.assign_worker(worker, other)
        await world.registry.set_fair_share(org, weight=1, max_live_attempts=cap)
        await queue(world, world.scan, 60)
        await queue(world, other_scan, 150)
        peak_cap, peak_worker, twice, stop = 0, 0, 0, asyncio.Event()

        async def watch() -> None:
            nonlocal peak_cap, peak_worker, twice
            while not stop.is_set():
                ((n,),) = await rows(pool, "SELECT count(*) FROM worker_task_attempts a JOIN worker_tasks t"
                                           " ON t.id = a.task_id WHERE t.organization_id = %s"
                                           " AND a.status IN ('leased', 'running')", org)
                peak_cap = max(peak_cap, n)
                peak_worker = max([peak_worker, *(await live_per_worker(pool)).values()])
                ((dup,),) = await rows(pool, "SELECT count(*) FROM (SELECT task_id FROM worker_task_attempts"
                                             " WHERE status IN ('leased', 'running') GROUP BY task_id"
                                             " HAVING count(*) > 1) d")
                twice = max(twice, dup)
                await asyncio.sleep(0)

        async def acquirer(worker: UUID) -> list[Acquired]:
            got: list[Acquired] = []
            for n in range(rounds):
                leases = await world.lifecycle.acquire_many(worker, 4)
                got.extend(leases)
                for a in leases:  # end the capped organisation's at once, the rest every other round
                    if a.task.organization_id == org or n % 2:
                        await world.lifecycle.fail(worker, a.task.id, a.attempt.id, a.lease_token, error="x",
                                                   retryable=False)
            return got

        watcher = asyncio.create_task(watch())
        results = await asyncio.gather(*(acquirer(w) for w in workers), return_exceptions=True)
        stop.set()
        await watcher
        errors = [r for r in results if isinstance(r, BaseException)]
        assert errors == []  # nothing refused, nothing deadlocked
        leases = [a for r in results if not isinstance(r, BaseException) for a in r]
        assert len(leases) > acquirers * capacity  # slots were freed and filled again
        assert len({a.attempt.id for a in leases}) == len(leases)
        assert sum(a.task.organization_id == org for a in leases) > cap
        assert peak_cap <= cap and peak_worker <= capacity and twice == 0
        assert max((await live_per_worker(pool)).values()) <= capacity
        # Each task was leased at most once per attempt number (no two attempts of one task live together).
        assert await rows(pool, "SELECT task_id, attempt_number FROM worker_task_attempts"
                                " GROUP BY task_id, attempt_number HAVING count(*) > 1") == []
        counters = dict(await rows(pool, "SELECT organization_id, live FROM org_service"))
        actual = dict(await rows(pool, "SELECT t.organization_id, count(*) FROM worker_task_attempts a"
                                       " JOIN worker_tasks t ON t.id = a.task_id"
                                       " WHERE a.status IN ('leased', 'running') GROUP BY t.organization_id"))
        assert {o: n for o, n in counters.items() if n} == actual
        async with await connect(database_url) as conn:
            assert await fair_share_differences(conn) == []
        await assert_log_rebuilds_live(database_url)
    finally:
        await pool.close()


async def test_one_worker_racing_itself_never_exceeds_its_capacity(world: World, pool: Any) -> None:
    await queue(world, world.scan, 30)
    worker = await world.worker(capacity=5)
    results = await asyncio.gather(*(world.lifecycle.acquire_many(worker, 4) for _ in range(10)),
                                   return_exceptions=True)
    assert [r for r in results if isinstance(r, LeaseholdError)] == []
    assert sum(len(r) for r in results if isinstance(r, list)) == 5
    assert await live_per_worker(pool) == {worker: 5}


async def test_a_lease_after_the_first_never_waits_for_a_busy_organisation(
        world: World, pool: Any, database_url: str) -> None:
    """The worker's second lease would come from an organisation whose fair-share row another
    transaction holds: the request ends with the one lease it has at once, waiting for no lock
    (holding one organisation's row while waiting for another's could deadlock)."""
    worker = await world.worker(capacity=10)
    other, other_scan = await tenant(world, "beta", worker)
    await queue(world, other_scan, 1, priority=5)  # the first lease: beta's, by priority
    await queue(world, world.scan, 4)
    first = await world.lifecycle.acquire(await world.worker())  # acme's row exists: someone was served
    assert first is not None and first.task.organization_id == world.org
    async with rows_locked(database_url, "SELECT 1 FROM org_service WHERE organization_id = %s FOR UPDATE",
                           (world.org,)) as holder:
        job, waiting = await waits_while_running(pool, holder, world.lifecycle.acquire_many(worker, 4))
        assert waiting == [], f"a lease after the first waited: {waiting}"
        leases = await asyncio.wait_for(job, 10)  # done while the holder still holds acme's row
    assert [a.task.organization_id for a in leases] == [other]
    after = await world.lifecycle.acquire_many(worker, 4)  # let go: acme's tasks are leased as usual
    assert [a.task.organization_id for a in after] == [world.org] * 3
