"""Helpers for the replay tests: a concurrent randomised workload through the service layer,
running the ``leasehold`` CLI in-process, and superuser tampering with the event log."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import orjson
import psycopg

from leasehold.domain.errors import LeaseholdError
from leasehold.domain.results import payload_sha256
from support.cli_runner import cli, run_cli
from support.core import World

__all__ = ["Workload", "cli", "cli_json", "random_workload", "run_cli", "tamper"]


@dataclass
class Workload:
    """What a randomised run did (for the test's own sanity checks)."""

    calls: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    tasks: list[UUID] = field(default_factory=list)


async def random_workload(world: World, *, seed: int, workers: int = 6, scans: int = 5, tasks_per_scan: int = 6,
                          rounds: int = 15, settle: bool = True) -> Workload:
    """Many workers acquire, run, renew, submit, complete, fail, go silent and write stale, while a
    sweeper expires leases and deadlines and an operator cancels; all concurrently, one clock."""
    rng = random.Random(seed)
    lc = world.lifecycle
    out = Workload()
    worker_ids = [await world.worker(capacity=rng.randint(1, 3)) for _ in range(workers)]
    for s in range(scans):
        scan = await world.scans.create_scan(world.org, {"targets": [f"10.1.{s}.0/24"]})
        for _ in range(tasks_per_scan):
            out.tasks.append(await world.task(scan=scan, max_attempts=rng.randint(1, 3),
                                              lease_seconds=rng.choice([10, 30, 60]),
                                              execution_timeout_seconds=rng.choice([40, 600]),
                                              priority=rng.randint(0, 2)))

    async def call(name: str, coro: Any) -> Any:
        out.calls[name] += 1
        try:
            return await coro
        except LeaseholdError as exc:
            out.refused[f"{name}:{type(exc).__name__}"] += 1
            return None

    async def worker_loop(worker: UUID, wrng: random.Random) -> None:
        for _ in range(rounds):
            got = await call("acquire", lc.acquire(worker, request_id=f"r-{wrng.random()}"
                                                   if wrng.random() < 0.3 else None))
            if got is None:
                await asyncio.sleep(0)
                continue
            args = (worker, got.task.id, got.attempt.id, got.lease_token)
            behaviour = wrng.choice(["complete", "complete", "complete", "fail", "fatal", "silent", "stale",
                                     "slow"])
            await call("progress", lc.mark_running(*args))
            if behaviour == "silent":
                continue  # the sweeper will expire it
            if behaviour == "stale":
                await call("complete", lc.complete(worker, got.task.id, got.attempt.id, "stolen-token"))
            if behaviour == "slow":
                world.clock.advance(wrng.choice([5, 12]))
                renewed = await call("renew", lc.renew(*args))
                if renewed is not None and renewed.cancel_requested:
                    await call("cancel-ack", lc.acknowledge_cancel(*args))
                    continue
            if behaviour in ("fail", "fatal"):
                await call("fail", lc.fail(*args, error=f"plugin exited {wrng.randint(1, 9)}",
                                           retryable=behaviour == "fail"))
                continue
            for seq in (1, 2):
                records = [{"type": "raw", "n": wrng.randint(0, 1000), "seq": seq}]
                await call("results", lc.submit_batch(
                    *args, sequence_number=seq, idempotency_key=f"{got.attempt.id}:{seq}",
                    payload_sha256=payload_sha256(records), records=records, final=seq == 2))
            await call("complete", lc.complete(*args))

    async def sweeper() -> None:
        for _ in range(rounds * 2):
            world.clock.advance(rng.choice([1, 2, 3, 6]))
            await call("expire", lc.expire_leases())
            await call("deadline", lc.exceed_deadlines())
            await call("terminate", lc.terminate_cancelling())
            await asyncio.sleep(0)

    async def operator() -> None:
        """Cancels now and then: mostly tasks a worker holds (-> cancelling), some at random."""
        for n in range(rounds * 3):
            await asyncio.sleep(0)
            if n % 6:
                continue
            async with world.pool.connection() as conn:
                cur = await conn.execute("SELECT id FROM worker_tasks WHERE state IN ('leased', 'running')")
                live = [r[0] for r in await cur.fetchall()]
            victim = rng.choice(live) if live and rng.random() < 0.8 else rng.choice(out.tasks)
            await call("cancel", lc.request_cancel(victim, actor="operator:test-key"))

    await asyncio.gather(*(worker_loop(w, random.Random(rng.random())) for w in worker_ids), sweeper(),
                         operator())
    if settle:  # let every lease run out so the run ends in a mix of terminal and retry states
        world.clock.advance(700)
        await call("expire", lc.expire_leases(limit=1000))
        await call("deadline", lc.exceed_deadlines(limit=1000))
        world.clock.advance(60)
        await call("terminate", lc.terminate_cancelling(limit=1000))
    return out


async def cli_json(*argv: str) -> tuple[int, Any]:
    code, out, err = await cli(*argv, "--json")
    assert out, err
    return code, orjson.loads(out)


def tamper(url: str, *statements: str | tuple[str, Sequence[Any]]) -> None:
    """Run statements as the superuser with triggers bypassed (``session_replication_role = replica``)."""
    with psycopg.connect(url, autocommit=False) as conn:
        conn.execute("SET session_replication_role = replica")
        for statement in statements:
            if isinstance(statement, tuple):
                conn.execute(statement[0], statement[1])
            else:
                conn.execute(statement)
        conn.commit()
