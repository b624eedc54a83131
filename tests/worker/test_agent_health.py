"""The agent's local health and metrics port (``--health-port``)."""

from __future__ import annotations

import aiohttp

from support.agent import register_worker, running_agent
from support.gateway import RunningGateway, free_port
from support.waits import wait_until


async def test_health_and_metrics_of_the_agent(gateway: RunningGateway) -> None:
    worker = await register_worker(gateway, ("tcp-connect",))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    async with running_agent(worker.settings(gateway, health_port=port, max_concurrency=3, wait_seconds=1)) as _, \
            aiohttp.ClientSession() as session:
        async def healthy() -> dict[str, object] | None:
            try:
                async with session.get(base + "/healthz") as r:
                    body = await r.json()
            except aiohttp.ClientConnectionError:
                return None
            return body if r.status == 200 and body["gateway"] == "reachable" else None

        health = await wait_until(healthy, timeout=15, what="the agent's /healthz to say ok")
        assert health["status"] == "ok" and health["capacity"] == 3 and health["running"] == 0
        async with session.get(base + "/metrics") as r:
            text = await r.text()
        assert "leasehold_worker_capacity 3" in text
        assert "leasehold_worker_gateway_reachable 1" in text
        assert 'leasehold_worker_tasks_total{outcome="completed"} 0' in text
