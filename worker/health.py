"""The worker agent's optional local health and metrics port (``--health-port``).

Plain HTTP on 127.0.0.1 only (a local probe or a Prometheus agent on the scanner host):

* ``GET /healthz``: 200 ``{"status": "ok" | "gateway-unreachable" | "stopping", "gateway": …,
  "running", "capacity", "completed", "failed", "cancelled", "lost"}`` while the agent runs (a
  Gateway it cannot reach does not make it unhealthy: it retries; the field says so);
* ``GET /metrics``: Prometheus text — ``leasehold_worker_tasks_running``,
  ``leasehold_worker_capacity``, ``leasehold_worker_tasks_total{outcome}``,
  ``leasehold_worker_gateway_reachable``, ``leasehold_worker_stopping``.

Imported only when the port is asked for: ``aiohttp.web`` costs the start-up of every other run.
"""

from __future__ import annotations

import json
from typing import Any

from leasehold.worker.status import OUTCOMES, Status

__all__ = ["HealthServer", "render_metrics"]


def render_metrics(status: Status) -> str:
    """The agent's counters in Prometheus text format."""
    summary = status.summary()
    lines = [
        "# HELP leasehold_worker_tasks_running Tasks this agent runs now",
        "# TYPE leasehold_worker_tasks_running gauge",
        f"leasehold_worker_tasks_running {summary['running']}",
        "# HELP leasehold_worker_capacity Tasks this agent runs at most at once (--max-concurrency)",
        "# TYPE leasehold_worker_capacity gauge",
        f"leasehold_worker_capacity {summary['capacity']}",
        "# HELP leasehold_worker_tasks_total Tasks this agent finished, by outcome",
        "# TYPE leasehold_worker_tasks_total counter",
        *(f'leasehold_worker_tasks_total{{outcome="{outcome}"}} {summary[outcome]}' for outcome in OUTCOMES),
        "# HELP leasehold_worker_gateway_reachable 1 while the Gateway answers",
        "# TYPE leasehold_worker_gateway_reachable gauge",
        f"leasehold_worker_gateway_reachable {0 if status.gateway_problem else 1}",
        "# HELP leasehold_worker_stopping 1 once the agent is shutting down",
        "# TYPE leasehold_worker_stopping gauge",
        f"leasehold_worker_stopping {1 if status.stopping else 0}",
    ]
    return "\n".join(lines) + "\n"


class HealthServer:
    """``/healthz`` and ``/metrics`` of one agent on ``127.0.0.1:port``."""

    def __init__(self, status: Status, port: int) -> None:
        self.status, self.port = status, port
        self._runner: Any = None

    async def start(self) -> int:
        """Listen; returns the bound port."""
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, request: Any) -> Any:
        from aiohttp import web

        summary = self.status.summary()
        state = "stopping" if self.status.stopping else "gateway-unreachable" if self.status.gateway_problem else "ok"
        body = {"status": state, "gateway": self.status.gateway_problem or "reachable", **summary}
        return web.Response(text=json.dumps(body), content_type="application/json")

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text=render_metrics(self.status), content_type="text/plain")
