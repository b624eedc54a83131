"""Redis is optional: its hints wake waiters across Gateways, and when it dies (or was never
configured) no request fails and tasks are still delivered within the poll bound."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import orjson
import pytest
from replicas_support import Cluster, RedisServer, Traffic, percentile, wake_up_latency

from leasehold.gateway.tls import PkiPaths
from support.gateway import GatewayProcess, RunningGateway, free_port, metric, running_gateway, service_get
from support.waits import wait_until

pytestmark = pytest.mark.slow  # Gateway processes and a Redis killed and restarted under traffic


async def redis_state(gateway: GatewayProcess) -> str | None:
    ready = await gateway.readyz()
    return None if ready is None else str(ready["redis"])


async def redis_is(gateway: GatewayProcess, state: str) -> None:
    async def reached() -> bool:
        return await redis_state(gateway) == state
    await wait_until(reached, 15, what=f"redis {state} on {gateway.operator_url}")


def outage_warnings(gateway: GatewayProcess) -> int:
    lines = [orjson.loads(line) for line in gateway.log_path.read_text().splitlines() if line.startswith("{")]
    return sum(1 for e in lines if e.get("logger") == "leasehold.hints" and e.get("level") == "WARNING")


#: B's safety poll: a wake-up faster than this came from a hint (B does not LISTEN).
HINTLESS_POLL_SECONDS = 3


async def test_hint_alone_wakes_a_waiter_that_does_not_listen(
        database_url: str, cluster: Callable[..., Awaitable[Cluster]], redis_server: RedisServer) -> None:
    c = await cluster(database_url, 1, redis_url=redis_server.url)
    # Gateway B does not LISTEN: without the hint its waiter would answer only at its next poll.
    b = GatewayProcess(database_url, c.gateways[0].pki, c.gateways[0].log_path.with_name("gateway-b.log"),
                       {"redis_url": redis_server.url, "listen": "false",
                        "poll_interval_seconds": HINTLESS_POLL_SECONDS})
    await b.start()
    try:
        c.gateways.append(b)
        c.views.append(b.client(c.services, c.org, c.scan))
        await redis_is(c.gateways[0], "connected")
        await redis_is(b, "connected")
        assert (await b.readyz() or {})["listening"] is False
        worker = await c.worker(on=1, capacity=20)
        hinted = [await wake_up_latency(c, create_on=0, wait_on=1, worker=worker) for _ in range(10)]
        print(f"hint-only wake-up: p50={percentile(hinted, 0.5) * 1000:.1f} ms max={max(hinted) * 1000:.1f} ms")
        # By the poll alone a wake-up would take 0..3 s: five of ten under 0.3 s would be a
        # one-in-600 fluke.
        assert percentile(hinted, 0.5) < 0.3 and max(hinted) < HINTLESS_POLL_SECONDS / 2, hinted
        assert await b.metric("leasehold_hints_received_total") >= 10

        await redis_server.kill()
        await redis_is(b, "unavailable")
        # No LISTEN and no Redis: the poll still delivers, within its bound.
        polled = await wake_up_latency(c, create_on=0, wait_on=1, worker=worker)
        assert polled < HINTLESS_POLL_SECONDS + 1.5, polled
        assert outage_warnings(b) == 1 and outage_warnings(c.gateways[0]) == 1  # once per outage
    finally:
        await b.stop()


POLL_SECONDS = 1.0


async def test_redis_killed_mid_run_fails_no_request(database_url: str, cluster: Callable[..., Awaitable[Cluster]],
                                                     redis_server: RedisServer) -> None:
    await steady_stream(await cluster(database_url, 2, poll_interval_seconds=POLL_SECONDS,
                                      redis_url=redis_server.url), redis_server)


async def test_redis_never_configured_fails_no_request(database_url: str,
                                                       cluster: Callable[..., Awaitable[Cluster]]) -> None:
    await steady_stream(await cluster(database_url, 2, poll_interval_seconds=POLL_SECONDS), None)


async def steady_stream(c: Cluster, server: RedisServer | None) -> None:
    """Two workers per Gateway acquire and complete what a producer creates (one task every
    50 ms at most, through each Gateway in turn); Redis (if any) is killed half way. No request
    may fail, every task must be delivered within the poll bound, and the outage is logged once
    per process."""
    for g in c.gateways:
        await redis_is(g, "connected" if server else "off")
    workers = [(on, await c.worker(on=on, capacity=4)) for on in (0, 1) for _ in range(2)]
    traffic = Traffic(c)
    traffic.start(workers, create_every=0.05, wait_seconds=2)
    try:
        await wait_until(lambda: _completed_at_least(traffic, 15), 30, what="15 tasks completed")
        if server is not None:
            killed = time.perf_counter()
            await server.kill()
            for g in c.gateways:
                await redis_is(g, "unavailable")
            await wait_until(lambda: _completed_after(traffic, killed, 30), 30, what="30 tasks completed after the kill")
        else:
            await wait_until(lambda: _completed_at_least(traffic, 45), 30, what="45 tasks completed")
        await traffic.stop()
    finally:
        await traffic.halt()
    assert traffic.failures() == []
    assert set(traffic.created) == set(traffic.acquired) == set(traffic.completed)
    delivery = traffic.delivery_seconds()
    print(f"{len(delivery)} tasks, delivery p50={percentile(list(delivery.values()), 0.5) * 1000:.1f} ms "
          f"max={max(delivery.values()) * 1000:.1f} ms")
    assert max(delivery.values()) < POLL_SECONDS + 1.0
    if server is not None:
        assert all(outage_warnings(g) == 1 for g in c.gateways)  # once per outage, not per request


async def _completed_at_least(traffic: Traffic, n: int) -> bool:
    return len(traffic.completed) >= n


async def _completed_after(traffic: Traffic, since: float, n: int) -> bool:
    return sum(1 for t in traffic.completed.values() if t > since) >= n



async def test_redis_down_from_the_start_changes_nothing(database_url: str, pki: PkiPaths,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"  # configured, never reachable
    with caplog.at_level(logging.INFO, logger="leasehold.hints"):
        async with running_gateway(database_url, pki, redis_url=nobody) as gw:
            worker = await gw.worker(capacity=10)
            for _ in range(5):
                waiting = asyncio.create_task(worker.acquire(wait=10))
                await wait_until(lambda: _parked(gw), 10, what="the acquire waits")
                started = time.perf_counter()
                task_id = await gw.task()
                reply = await waiting
                assert reply.status == 200 and reply.body["lease"]["task"]["id"] == str(task_id)
                assert time.perf_counter() - started < 1.0  # NOTIFY woke it; Redis held nothing up
            await wait_until(lambda: _dropped(gw), 10, what="the hints were dropped")
            assert await metric(pki, gw.operator_url, "leasehold_redis_connected") == 0
            ready = await service_get(pki, gw.operator_url + "/readyz")
            assert ready.status == 200 and ready.body["redis"] == "unavailable"
    warnings = [r for r in caplog.records if r.name == "leasehold.hints" and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # once per outage, not per request
    assert warnings[0].__dict__["redis"] == nobody  # credential-free URL


async def _parked(gw: RunningGateway) -> bool:
    return await metric(gw.pki, gw.operator_url, "leasehold_long_polls_waiting") >= 1


async def _dropped(gw: RunningGateway) -> bool:
    return await metric(gw.pki, gw.operator_url, "leasehold_hints_dropped_total") >= 1
