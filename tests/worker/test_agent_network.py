"""The worker agent behind a fault-injecting TCP proxy (:mod:`support.faultproxy`): lost answers,
resets and a blackholed Gateway never lose or duplicate a lease or a result batch.

TLS passes through the proxy untouched: the agent connects to ``https://localhost:<proxy>`` and
still verifies the Gateway's certificate; the Gateway still sees the worker's certificate.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path
from uuid import uuid4

import aiohttp
import pytest
from aiohttp import web
from pydantic import SecretStr

from leasehold.gateway.tls import server_ssl_context
from leasehold.worker.backoff import Backoff
from leasehold.worker.client import (
    AttemptRef,
    GatewayClient,
    GatewayUnavailable,
    LeaseLost,
    Rejected,
    TaskWasCancelled,
)
from support.agent import (
    attempts,
    batches,
    python_plugin,
    records,
    register_worker,
    rows,
    running_agent,
    task_state,
    wait_state,
)
from support.faultproxy import Fault, fault_proxy
from support.gateway import RunningGateway
from support.waits import wait_until


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def _event_count(gateway: RunningGateway, task_id: object, event: str) -> int:
    [(count,)] = await rows(gateway, "SELECT count(*) FROM events WHERE originator_id = %s AND topic LIKE %s",
                            task_id, f"%{event}")
    return int(count)


async def test_lost_answer_to_a_result_batch_is_retried_and_accepted_exactly_once(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    go = tmp_path / "go"
    python_plugin(plugins_dir, "emit", f"""
        import json, os, time
        while not os.path.exists({str(go)!r}):
            time.sleep(0.01)  # the plugin waits for the test's go (a file), then emits
        for n in range(30):
            print(json.dumps({{"type": "raw", "n": n, "pad": "x" * 100}}))
    """)
    worker = await register_worker(gateway, ("emit",))
    task_id = await gateway.task(task_type="emit", lease_seconds=30)
    caplog.set_level(logging.INFO, logger="leasehold.worker.task")
    async with fault_proxy(_port(gateway.worker_url)) as proxy:
        # One task at a time: while it runs no acquire is in flight, so the first request after
        # the flag is set is the plugin's result batch (renewals come every 10 s).
        # 30 records in batches of 20: the first travels on /results, the last with /complete.
        settings = worker.settings(gateway, gateway=proxy.url(), plugins_dir=plugins_dir, max_concurrency=1,
                                   batch_records=20, batch_seconds=30)
        flag = asyncio.Event()
        rule = proxy.add_rule(Fault.DROP_RESPONSE, when=flag.is_set, times=1)
        async with running_agent(settings):
            await wait_state(gateway, task_id, "running")
            flag.set()
            go.touch()
            await rule.wait()
            await wait_state(gateway, task_id, "completed")

    [dropped] = proxy.faulted(Fault.DROP_RESPONSE)
    assert dropped.answered  # the Gateway did answer; the worker never saw it
    [attempt] = await attempts(gateway, task_id)
    first, last = await batches(gateway, task_id)  # one row per (attempt, sequence), not two
    assert (first["attempt_id"], first["sequence_number"], first["final"]) == (attempt["id"], 1, False)
    assert first["idempotency_key"] == f"{attempt['id']}:1"
    assert [r["n"] for r in first["records"]] == list(range(20))
    assert (last["sequence_number"], last["final"], [r["n"] for r in last["records"]]) == (2, True, list(range(20, 30)))
    acks = [r for r in caplog.records if r.getMessage() == "result batch accepted"]
    assert [(r.sequence_number, r.duplicate) for r in acks] == [(1, True)]  # type: ignore[attr-defined]
    assert await _event_count(gateway, task_id, "ResultBatchAccepted") == 2


async def test_lost_answer_to_an_acquire_returns_the_same_attempt_not_a_second_lease(
        gateway: RunningGateway, plugins_dir: Path) -> None:
    python_plugin(plugins_dir, "quick", """
        print('{"type": "raw", "ok": true}')
    """)
    worker = await register_worker(gateway, ("quick",))
    first = await gateway.task(task_type="quick")
    second = await gateway.task(task_type="quick")
    async with fault_proxy(_port(gateway.worker_url)) as proxy:
        rule = proxy.add_rule(Fault.DROP_RESPONSE, nth=1)  # the agent's very first request: an acquire
        settings = worker.settings(gateway, gateway=proxy.url(), plugins_dir=plugins_dir, max_concurrency=1)
        async with running_agent(settings):
            await rule.wait()
            for task_id in (first, second):
                await wait_state(gateway, task_id, "completed")

    for task_id in (first, second):
        assert (await task_state(gateway, task_id))[:2] == ("completed", 1)
        assert len(await attempts(gateway, task_id)) == 1
    # The retried acquire (same request id) re-issued the lease the lost answer carried.
    assert await _event_count(gateway, first, "LeaseReissued") == 1
    assert [r["ok"] for r in await records(gateway, first)] == [True]


async def test_gateway_outage_backs_off_without_spinning_then_recovers(
        gateway: RunningGateway, plugins_dir: Path) -> None:
    python_plugin(plugins_dir, "quick", """
        print('{"type": "raw", "ok": true}')
    """)
    worker = await register_worker(gateway, ("quick",))
    task_id = await gateway.task(task_type="quick")
    async with fault_proxy(_port(gateway.worker_url)) as proxy:
        proxy.mode = Fault.RESET
        settings = worker.settings(gateway, gateway=proxy.url(), plugins_dir=plugins_dir,
                                   backoff_initial_seconds=0.05, backoff_max_seconds=0.4, request_timeout_seconds=1.0)
        async with running_agent(settings) as agent:
            await asyncio.sleep(1.5)  # a window of outage whose retries are counted: what this test measures
            resets = proxy.connections
            assert 2 <= resets <= 40, resets  # retried, with backoff: no busy loop
            assert agent.status.gateway_problem is not None
            proxy.mode = Fault.BLACKHOLE  # now connections hang: each try ends at its timeout
            await asyncio.sleep(1.5)  # likewise a counted window
            assert proxy.connections - resets <= 6
            assert (await task_state(gateway, task_id))[0] == "pending"
            proxy.mode = Fault.PASS
            started = time.monotonic()
            await wait_state(gateway, task_id, "completed", within=10)
            assert time.monotonic() - started < 5
            await wait_until(lambda: agent.status.gateway_problem is None,
                             what="the status to show the Gateway reachable")
    assert (await task_state(gateway, task_id))[:2] == ("completed", 1)


async def test_fault_proxy_counts_requests_on_a_keep_alive_tls_connection(gateway: RunningGateway) -> None:
    client = await register_worker(gateway, ("quick",))
    ssl = gateway.worker_ssl(client.cert, client.key)
    async with fault_proxy(_port(gateway.worker_url)) as proxy, aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl, limit=1)) as session:
        rule = proxy.add_rule(Fault.DROP_RESPONSE, nth=3)
        url = proxy.url() + "/v1/tasks/acquire"
        for _ in range(2):
            async with session.post(url, json={"wait_seconds": 0}) as response:
                assert response.status == 204  # the certificate verified through the proxy, both ways
        with pytest.raises(aiohttp.ClientError):
            async with session.post(url, json={"wait_seconds": 0}) as response:
                await response.read()
        assert rule.hits == 1 and proxy.connections == 1
        assert [(r.number, r.fault, r.answered) for r in proxy.requests] == [
            (1, Fault.PASS, True), (2, Fault.PASS, True), (3, Fault.DROP_RESPONSE, True)]
        proxy.add_rule(Fault.RESET, times=1)
        with pytest.raises(aiohttp.ClientError):
            async with session.post(url, json={"wait_seconds": 0}) as response:
                await response.read()
        async with session.post(url, json={"wait_seconds": 0}) as response:
            assert response.status == 204
        assert proxy.connections == 3


async def test_client_retries_network_errors_5xx_and_429_but_not_other_4xx(gateway: RunningGateway) -> None:
    answers: dict[str, list[tuple[int, dict[str, str]]]] = {
        "acquire": [(503, {}), (500, {}), (429, {"Retry-After": "1"}), (204, {})],
        "renew": [(409, {"type": "https://leasehold.dev/problems/task-cancelled"})],
        "progress": [(409, {"type": "https://leasehold.dev/problems/lease-lost"})],
        "complete": [(404, {})],
        "fail": [(422, {"type": "https://leasehold.dev/problems/validation", "detail": "bad body"})],
        "cancel-ack": [(502, {})] * 100,
    }
    seen: list[tuple[str, float]] = []

    async def handle(request: web.Request) -> web.Response:
        route = request.path.rsplit("/", 1)[-1]
        seen.append((route, time.monotonic()))
        status, extra = answers[route].pop(0)
        headers = {k: v for k, v in extra.items() if k == "Retry-After"}
        body = {k: v for k, v in extra.items() if k != "Retry-After"}
        if status == 204:
            return web.Response(status=204)
        return web.json_response({"status": status, **body}, status=status, headers=headers,
                                 content_type="application/problem+json")

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl_context(gateway.pki))
    await site.start()
    worker = await register_worker(gateway, ("quick",))
    settings = worker.settings(gateway, gateway=f"https://localhost:{runner.addresses[0][1]}",
                               backoff_initial_seconds=0.05, backoff_max_seconds=0.1)
    attempt = AttemptRef(uuid4(), uuid4(), SecretStr("t" * 32))
    try:
        async with GatewayClient(settings) as client:
            answer = await client.acquire("request-1", wait_seconds=1)
            assert answer.lease is None and answer.cancel_requested == []
            tries = [t for route, t in seen if route == "acquire"]
            assert len(tries) == 4
            assert tries[3] - tries[2] >= 1.0  # Retry-After respected
            with pytest.raises(TaskWasCancelled):
                await client.renew(attempt)
            with pytest.raises(LeaseLost):
                await client.progress(attempt)
            with pytest.raises(LeaseLost):
                await client.complete(attempt)
            with pytest.raises(Rejected, match="bad body") as refused:
                await client.fail(attempt, error="x", retryable=True)
            assert not isinstance(refused.value, LeaseLost | TaskWasCancelled)
            deadline = time.monotonic() + 0.5
            with pytest.raises(GatewayUnavailable, match="HTTP 502"):
                await client.cancel_ack(attempt, retry_while=lambda: time.monotonic() < deadline)
            assert 3 <= len([r for r, _ in seen if r == "cancel-ack"]) <= 40
    finally:
        await runner.cleanup()
    assert len([r for r, _ in seen if r in ("renew", "progress", "complete", "fail")]) == 4  # final: one try each

    backoff = Backoff(0.1, 1.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(8)]
    assert all(0.05 <= d <= 1.0 for d in delays) and max(delays[4:]) > 0.2
    assert backoff.next_delay(at_least=5.0) == 5.0
