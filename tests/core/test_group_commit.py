"""Group commit: concurrent commands share transactions, and each still behaves as if alone.

Real connections racing: many workers' lifecycles at once through a :class:`GroupCommit`, a
refusal and a database error inside shared transactions, and no answer before its COMMIT.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from leasehold.domain.errors import Conflict, NotFound
from leasehold.domain.results import payload_sha256
from leasehold.gateway.commands.lifecycle import ResultBatch
from leasehold.gateway.services import build_services
from leasehold.persistence.group_commit import GroupCommit
from leasehold.persistence.transaction import Database, Transaction
from leasehold.projections.rows import Insert, Update
from support.core import ManualClock, World, assert_log_rebuilds_live

RECORDS = [{"type": "asset", "kind": "host", "value": "h"}]


@pytest.fixture
async def grouped(pool: AsyncConnectionPool, clock: ManualClock) -> tuple[World, GroupCommit]:
    db = Database(pool)
    group = GroupCommit(db, lanes=2, max_batch=16).install()
    services = build_services(db, clock=clock, rng=random.Random(3))
    org = await services.registry.create_organization("acme")
    scan = await services.scans.create_scan(org, {"targets": ["192.0.2.10"]})
    return World(services, clock, org, scan), group


async def _count(database_url: str, query: str, *params: Any) -> int:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_concurrent_lifecycles_share_transactions_and_end_as_if_alone(
        grouped: tuple[World, GroupCommit], database_url: str) -> None:
    world, group = grouped
    workers = [await world.worker(capacity=2) for _ in range(12)]
    for _ in range(24):
        await world.task()

    async def lifecycles(worker: Any) -> int:
        done = 0
        while (a := await world.lifecycle.acquire(worker)) is not None:
            await world.lifecycle.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
            await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token,
                                           final_batch=_final())
            done += 1
        return done

    assert sum(await asyncio.gather(*(lifecycles(w) for w in workers))) == 24
    assert await _count(database_url, "SELECT count(*) FROM worker_tasks WHERE state = 'completed'") == 24
    assert group.stats.largest > 1 and group.stats.transactions < group.stats.bodies  # batches formed
    await assert_log_rebuilds_live(database_url)


def _final() -> ResultBatch:
    return ResultBatch(1, "final", payload_sha256(RECORDS), RECORDS)


async def test_a_refusal_does_not_fail_its_neighbours(pool: AsyncConnectionPool, world: World,
                                                     database_url: str) -> None:
    """Bodies queued behind one another in one lane: the one that refuses (before writing) gets
    its error; the others commit."""
    db = Database(pool)
    group = GroupCommit(db, lanes=1).install()
    tasks = [await world.task(priority=i) for i in range(6)]

    async def bump(task: Any, tx: Transaction) -> str:
        if task is None:
            raise NotFound("no such task")
        tx.apply([Update("worker_tasks", {"id": task}, {"priority": 99})])
        return "ok"

    bodies = [*tasks[:3], None, *tasks[3:]]
    results = await asyncio.gather(*(db.run(lambda tx, t=t: bump(t, tx), key="one lane") for t in bodies),
                                   return_exceptions=True)
    assert [type(r).__name__ if isinstance(r, Exception) else r for r in results] == [
        "ok", "ok", "ok", "NotFound", "ok", "ok", "ok"]
    assert group.stats.retried_alone == 0
    assert await _count(database_url, "SELECT count(*) FROM worker_tasks WHERE priority = 99") == 6


async def test_a_database_error_fails_only_the_body_that_caused_it(pool: AsyncConnectionPool, world: World,
                                                                  database_url: str) -> None:
    """The shared transaction is rolled back and its bodies run again one by one: the body whose
    write breaks a unique constraint gets the conflict, the others commit."""
    db = Database(pool)
    group = GroupCommit(db, lanes=1).install()
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT * FROM organizations WHERE id = %s", (world.org,))
        assert cur.description is not None
        org = dict(zip([c.name for c in cur.description], await cur.fetchone() or (), strict=True))
    tasks = [await world.task() for _ in range(4)]

    async def body(tx: Transaction, task: Any, duplicate: bool) -> str:
        tx.apply([Update("worker_tasks", {"id": task}, {"priority": 7})])
        if duplicate:  # the same organisation name again: a unique violation at the next statement
            tx.apply([Insert("organizations", {**org, "id": uuid4()})])
        await tx.one("clock_now", {"now": None})  # sends the writes inside the shared transaction
        return "ok"

    results = await asyncio.gather(*(db.run(lambda tx, t=t, d=(i == 1): body(tx, t, d), key="one lane")
                                     for i, t in enumerate(tasks)), return_exceptions=True)
    assert ["ok" if r == "ok" else type(r).__name__ for r in results] == ["ok", "Conflict", "ok", "ok"]
    assert isinstance(results[1], Conflict)
    assert group.stats.retried_alone > 0
    assert await _count(database_url, "SELECT count(*) FROM worker_tasks WHERE priority = 7") == 3


async def test_no_answer_leaves_before_its_commit(pool: AsyncConnectionPool, world: World,
                                                  database_url: str) -> None:
    """Whenever a body's answer arrives, another connection already sees its write."""
    db = Database(pool)
    GroupCommit(db, lanes=1, max_batch=8).install()
    tasks = [await world.task() for _ in range(8)]
    seen: list[int] = []

    async def one(task: Any, n: int) -> None:
        await db.run(lambda tx: _set_priority(tx, task, n), key="one lane")
        seen.append(await _count(database_url, "SELECT priority FROM worker_tasks WHERE id = %s", task))

    await asyncio.gather(*(one(t, 10 + n) for n, t in enumerate(tasks)))
    assert sorted(seen) == list(range(10, 18))


async def _set_priority(tx: Transaction, task: Any, priority: int) -> None:
    tx.apply([Update("worker_tasks", {"id": task}, {"priority": priority})])
