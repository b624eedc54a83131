"""PostgreSQL restarted under the Gateways (``pg_ctl restart -m immediate``: a crash and
recovery): they recover without being restarted, acquisitions succeed again within 10 s,
LISTEN is re-established, and every event acknowledged to a client is still there."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from replicas_support import Cluster, Traffic, wake_up_latency

from leasehold.persistence.chain import verify_chains
from leasehold.persistence.connection import connect
from support.waits import wait_until

#: Far above a notified wake-up: a fast wake-up after recovery proves LISTEN is back.
POLL_SECONDS = 5


def first_lease_after(traffic: Traffic, gateway: int, since: float) -> float | None:
    """When the first acquire started after ``since`` on ``gateway`` answered with a lease."""
    ended = [r.ended for r in traffic.requests
             if r.kind == "acquire" and r.gateway == gateway and r.started >= since and r.outcome == 200]
    return min(ended) if ended else None


@pytest.mark.slow
async def test_gateways_recover_from_an_immediate_restart(owned_pg_server: Any,
                                                          cluster: Callable[..., Awaitable[Cluster]]) -> None:
    c = await cluster(owned_pg_server.database(), 2, poll_interval_seconds=POLL_SECONDS)
    pids = [(await g.get("/healthz")).body["pid"] for g in c.gateways]
    workers = [(on, await c.worker(on=on, capacity=4)) for on in (0, 1) for _ in range(2)]
    traffic = Traffic(c)
    traffic.start(workers, create_every=0.05, wait_seconds=2)
    try:
        acknowledged = await crash_and_recover(owned_pg_server, c, traffic)
    finally:
        await traffic.halt()

    # Notifications cross Gateways again (a poll would take up to POLL_SECONDS).
    worker = await c.worker(on=1, capacity=5)
    latencies = [await wake_up_latency(c, create_on=0, wait_on=1, worker=worker) for _ in range(3)]
    assert max(latencies) < 1.0, latencies

    # The same processes, never restarted.
    assert [(await g.get("/healthz")).body["pid"] for g in c.gateways] == pids
    assert all(g.proc.returncode is None for g in c.gateways)

    # Every event acknowledged to a client before the crash (and after it) is in the log, and
    # every hash chain is intact.
    async with await connect(c.url) as conn:
        for event, tasks in [("TaskCreated", acknowledged["TaskCreated"] | set(traffic.created)),
                             ("TaskCompleted", acknowledged["TaskCompleted"] | set(traffic.completed))]:
            cur = await conn.execute("SELECT originator_id FROM events WHERE originator_id = ANY(%s)"
                                     " AND topic LIKE %s", (list(tasks), f"%:{event}"))
            assert {r[0] for r in await cur.fetchall()} == tasks, event
        assert await verify_chains(conn) == []


async def crash_and_recover(server: Any, c: Cluster, traffic: Traffic) -> dict[str, set[Any]]:
    """Restart the server under steady traffic; check the recovery; the tasks whose creation
    and completion were acknowledged before the crash."""
    async def completed(n: int) -> bool:
        return len(traffic.completed) >= n

    await wait_until(lambda: completed(20), 30, what="20 tasks completed before the crash")
    crashed = time.perf_counter()
    acknowledged = {"TaskCreated": set(traffic.created), "TaskCompleted": set(traffic.completed)}
    await asyncio.to_thread(server.restart, "immediate")
    back = time.perf_counter()
    await c.pool.check()  # the test's own pool lost its connections too

    async def leased_again() -> bool:
        return all(first_lease_after(traffic, on, back) is not None for on in (0, 1))

    await wait_until(leased_again, 30, what="both Gateways lease tasks again")
    recovery = [first_lease_after(traffic, on, back) - back for on in (0, 1)]  # type: ignore[operator]
    print(f"restart took {back - crashed:.2f} s; first lease after it: "
          + ", ".join(f"{r:.2f} s" for r in recovery)
          + f"; requests failed around it: {[(r.kind, r.outcome) for r in traffic.failures(since=crashed)]}")
    assert max(recovery) < 10, recovery

    async def listening() -> bool:
        states = [await g.readyz() for g in c.gateways]
        return all(s is not None and s["listening"] is True for s in states)

    await wait_until(listening, 10, what="both Gateways LISTEN again")
    steady = time.perf_counter()
    done = len(traffic.completed)
    await wait_until(lambda: completed(done + 20), 30, what="20 more tasks completed")
    await traffic.stop()
    assert traffic.failures(since=steady) == []  # once recovered, nothing fails
    assert set(traffic.completed) >= set(traffic.created)
    return acknowledged
