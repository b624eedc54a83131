"""Each listener serves its own API: the worker port the worker API (and the probes and the
OpenAPI document), the operator port the operator API and the metrics, the plain-HTTP health
port only the probes. Elsewhere a route does not exist (404)."""

from __future__ import annotations

import aiohttp

from leasehold.gateway.tls import PkiPaths
from support.gateway import ADMIN_KEY, free_port, running_gateway, service_get


async def test_each_port_serves_only_its_routes(database_url: str, pki: PkiPaths) -> None:
    health_port = free_port()
    async with running_gateway(database_url, pki, health_port=health_port) as gw:
        worker = await gw.worker()
        auth = {"Authorization": f"Bearer {ADMIN_KEY}"}

        async def on_worker_port(method: str, path: str) -> int:
            async with worker.session.request(method, gw.worker_url + path, headers=auth, json={}) as r:
                return r.status

        # The worker port: the worker API, the probes, the document; not the operator API, not metrics.
        assert await on_worker_port("POST", "/v1/tasks/acquire") == 204
        assert await on_worker_port("GET", "/healthz") == 200
        assert await on_worker_port("GET", "/readyz") == 200
        assert await on_worker_port("GET", "/openapi.json") == 200
        assert await on_worker_port("GET", "/metrics") == 404
        assert await on_worker_port("GET", "/v1/organizations") == 404
        assert await on_worker_port("POST", "/v1/organizations") == 404

        # The operator port: the operator API and metrics; the worker API is not there.
        assert (await gw.operator("GET", "/v1/organizations")).status == 200
        assert (await gw.operator("POST", "/v1/tasks/acquire", {})).status == 404
        assert (await service_get(pki, gw.operator_url + "/metrics")).status == 200
        # Probes on the operator port need no client certificate (and no key).
        assert (await service_get(pki, gw.operator_url + "/readyz")).status == 200

        # The health port: plain HTTP, no certificate, the probes only.
        base = f"http://127.0.0.1:{health_port}"
        async with aiohttp.ClientSession() as s:
            for path, status in (("/healthz", 200), ("/readyz", 200), ("/metrics", 404), ("/openapi.json", 404),
                                 ("/v1/organizations", 404)):
                async with s.get(base + path, headers=auth) as r:
                    assert r.status == status, path
            async with s.post(base + "/v1/tasks/acquire", json={}) as r:
                assert r.status == 404
