"""The sweeper racing renewals and completions on real time, over many connections, with
two-second leases that do run out during the race: some workers renew (or complete) in time,
some too late, while four sweepers sweep back to back.

Whatever the interleaving, the log must show that a sweep only ended leases that had run out
when it decided, and that a renewal or completion was only accepted on a lease that was still
valid; and each worker's view (accepted or refused) must agree with how its task ended.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from leasehold.domain.errors import LeaseLost
from leasehold.domain.events import AttemptTimedOut, LeaseExpired, LeaseRenewed, TaskCompleted
from leasehold.domain.task import TaskState, project_task
from leasehold.gateway.background.sweeper import sweep_once
from leasehold.gateway.commands.lifecycle import Acquired
from leasehold.gateway.services import build_services
from leasehold.persistence.event_log import read_stream
from leasehold.persistence.transaction import Database
from support.core import ManualClock, World

TASKS = 16
SWEEPERS = 4
LEASE_SECONDS = 2
# When each worker acts, relative to its lease's end: the first ten in time, the rest too late.
OFFSETS = [-1.0 + 0.1 * i for i in range(TASKS)]
RENEW_EVERY = 0.4  # well inside the lease, so a busy machine does not make a renewal late


async def real_time_world(pool: AsyncConnectionPool) -> World:
    """Services on the database's own clock (``now()``), not a test clock."""
    services = build_services(Database(pool), rng=random.Random(7))
    org = await services.registry.create_organization("racers")
    scan = await services.scans.create_scan(org, {"targets": ["192.0.2.10"]})
    return World(services, ManualClock(), org, scan)  # (the manual clock is not used)


async def running_tasks(world: World) -> list[tuple[UUID, Acquired]]:
    """TASKS tasks with short leases, each running on a worker of its own."""
    workers = [await world.worker() for _ in range(TASKS)]
    for _ in range(TASKS):
        await world.task(lease_seconds=LEASE_SECONDS, max_attempts=3)
    acquired = await asyncio.gather(*(world.lifecycle.acquire(w) for w in workers))
    assert all(a is not None for a in acquired)
    pairs = [(w, a) for w, a in zip(workers, acquired, strict=True) if a is not None]
    await asyncio.gather(*(world.lifecycle.mark_running(w, a.task.id, a.attempt.id, a.lease_token)
                           for w, a in pairs))
    return pairs


async def at(moment: datetime) -> None:
    """Sleep until the wall-clock ``moment`` (the database runs on this machine's clock): each
    actor acts at its offset from its lease's end, which is the race this module runs."""
    await asyncio.sleep(max(0.0, (moment - datetime.now(UTC)).total_seconds()))


async def sweeping(world: World, until: float) -> int:
    """Sweep back to back until the monotonic time ``until``; how many passes."""
    passes = 0
    while time.monotonic() < until:
        await sweep_once(world.lifecycle)
        passes += 1
    return passes


async def audit_the_log(world: World, task_ids: list[UUID]) -> Counter[str]:
    """Fold each task's stream and check every sweep, renewal and completion against the task as
    it was right before (its decision time is the event's ``timestamp``). Counts by event type."""
    seen: Counter[str] = Counter()
    async with world.pool.connection() as conn:
        for task_id in task_ids:
            task: TaskState | None = None
            for event in await read_stream(conn, task_id):
                seen[type(event).__name__] += 1
                if isinstance(event, LeaseExpired | AttemptTimedOut | LeaseRenewed | TaskCompleted):
                    assert task is not None and task.current_attempt is not None
                    attempt = task.current_attempt
                    assert attempt.id == event.attempt_id and attempt.live, (event, attempt)
                    if isinstance(event, LeaseExpired):
                        assert attempt.lease_expires_at <= event.timestamp, (
                            "a sweep ended a lease that had not run out when it decided", event, attempt)
                    elif isinstance(event, AttemptTimedOut):
                        assert attempt.deadline_at <= event.timestamp, (event, attempt)
                    else:
                        assert attempt.lease_expires_at > event.timestamp, (
                            "a write was accepted on a lease that had run out", event, attempt)
                task = project_task([event], task)
    return seen


async def end_states(pool: AsyncConnectionPool, task_ids: list[UUID]) -> dict[UUID, tuple[str, str]]:
    """(task state, attempt status) of each task (each has made one attempt)."""
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT t.id, t.state, a.status FROM worker_tasks t"
                                 " JOIN worker_task_attempts a ON a.task_id = t.id WHERE t.id = ANY(%s)",
                                 (task_ids,))
        return {row[0]: (row[1], row[2]) for row in await cur.fetchall()}


async def race(world: World, pairs: list[tuple[UUID, Acquired]],
               act: Callable[[UUID, Acquired, float, float], Awaitable[list[str]]]) -> list[list[str]]:
    """Run one actor per task (at its offset from its lease's end) against SWEEPERS sweepers;
    the actors' outcomes, in task order."""
    last_end = max(a.attempt.lease_expires_at for _, a in pairs)
    until = time.monotonic() + (last_end - datetime.now(UTC)).total_seconds() + 0.8
    results = await asyncio.gather(
        *(act(w, a, offset, until) for (w, a), offset in zip(pairs, OFFSETS, strict=True)),
        *(sweeping(world, until) for _ in range(SWEEPERS)))
    passes = results[TASKS:]
    assert all(p > 0 for p in passes), passes
    await sweep_once(world.lifecycle)  # the late ones' leases have all run out by now
    return list(results[:TASKS])


async def test_sweepers_racing_renewals_end_only_leases_that_had_run_out(pool: AsyncConnectionPool) -> None:
    world = await real_time_world(pool)
    pairs = await running_tasks(world)

    async def renewer(worker: UUID, a: Acquired, offset: float, until: float) -> list[str]:
        """Renew at ``offset`` from the lease's end, then every RENEW_EVERY seconds while accepted."""
        await at(a.attempt.lease_expires_at + timedelta(seconds=offset))
        outcomes: list[str] = []
        while time.monotonic() < until:
            try:
                await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
            except LeaseLost as exc:
                outcomes.append(str(exc.details.get("reason")))
                break
            outcomes.append("renewed")
            await asyncio.sleep(RENEW_EVERY)  # the renewal cadence racing the sweepers
        return outcomes

    outcomes = await race(world, pairs, renewer)
    task_ids = [a.task.id for _, a in pairs]
    seen = await audit_the_log(world, task_ids)
    kept = [i for i, o in enumerate(outcomes) if o and all(x == "renewed" for x in o)]
    lost = [i for i, o in enumerate(outcomes) if o and o[-1] != "renewed"]
    assert kept and lost, outcomes  # the race had both sides: leases kept alive and leases run out
    assert all(outcomes[i][-1] == "lease_expired" for i in lost), outcomes  # refused only once run out
    assert seen["LeaseExpired"] == len(lost)
    for i in kept:  # renewed in time, again and again: never expired by any sweeper
        assert len(outcomes[i]) >= 2
    ended = await end_states(pool, task_ids)
    for i, task_id in enumerate(task_ids):
        assert ended[task_id] == (("running", "running") if i in kept else ("retry_wait", "expired")), (
            i, outcomes[i], ended[task_id])


async def test_sweepers_racing_completions_end_each_task_exactly_one_way(pool: AsyncConnectionPool) -> None:
    world = await real_time_world(pool)
    pairs = await running_tasks(world)
    for w, a in pairs:
        await world.final_batch(w, a)

    async def completer(worker: UUID, a: Acquired, offset: float, until: float) -> list[str]:
        await at(a.attempt.lease_expires_at + timedelta(seconds=offset))
        try:
            await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)
        except LeaseLost as exc:
            return [str(exc.details.get("reason"))]
        return ["completed"]

    outcomes = await race(world, pairs, completer)
    task_ids = [a.task.id for _, a in pairs]
    seen = await audit_the_log(world, task_ids)
    done = [i for i, o in enumerate(outcomes) if o == ["completed"]]
    lost = [i for i, o in enumerate(outcomes) if o == ["lease_expired"]]
    assert done and lost and len(done) + len(lost) == TASKS, outcomes
    assert (seen["TaskCompleted"], seen["LeaseExpired"]) == (len(done), len(lost))
    ended = await end_states(pool, task_ids)
    for i, task_id in enumerate(task_ids):
        assert ended[task_id] == (("completed", "succeeded") if i in done else ("retry_wait", "expired")), (
            i, outcomes[i], ended[task_id])
