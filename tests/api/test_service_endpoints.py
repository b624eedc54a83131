"""Health, readiness, metrics and the OpenAPI document."""

from __future__ import annotations

from leasehold.migrations import runner as migrate
from support.gateway import RunningGateway
from support.waits import wait_until


async def test_health_and_readiness(gateway: RunningGateway) -> None:
    assert (await gateway.operator("GET", "/healthz")).body["status"] == "ok"
    ready = await gateway.operator("GET", "/readyz")
    assert ready.status == 200 and ready.body["status"] == "ready" and ready.body["listening"] is True
    assert ready.body["schema"] == {"revision": migrate.head(), "expected": migrate.head(), "current": True}


async def test_readiness_fails_when_the_schema_moves_underneath(gateway: RunningGateway) -> None:
    """A migration (here: a downgrade) run under a running Gateway makes it not ready, saying why."""
    previous = migrate.revisions()[-2]
    async with gateway.pool.connection() as conn:
        await conn.execute("UPDATE alembic_version SET version_num = %s", (previous,))
    ready = await gateway.operator("GET", "/readyz")
    assert ready.status == 503 and ready.headers["Content-Type"].startswith("application/problem+json")
    assert ready.body["schema"] == {"revision": previous, "expected": migrate.head(), "current": False}
    assert f"at revision {previous}" in ready.body["detail"]


async def test_openapi_documents_every_route(gateway: RunningGateway) -> None:
    from aiohttp import web

    doc = (await gateway.operator("GET", "/openapi.json")).body
    assert doc["openapi"] == "3.1.0"
    from leasehold.gateway.app import create_app
    from leasehold.gateway.console.sessions import PATH as CONSOLE

    app: web.Application = create_app(gateway.settings)
    for resource in app.router.resources():
        info = resource.get_info()
        path = info.get("path") or info.get("formatter")
        if path.startswith(CONSOLE + "/") or path == CONSOLE:
            # The console's HTML pages are not the HTTP API: never in the API's document.
            assert path not in doc["paths"], path
            continue
        for route in resource:
            if route.method == "HEAD":
                continue
            assert route.method.lower() in doc["paths"].get(path, {}), f"{route.method} {path} missing"
    acquire = doc["paths"]["/v1/tasks/acquire"]["post"]
    assert acquire["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("AcquireRequest")
    assert "AcquireResponse" in doc["components"]["schemas"]


async def test_metrics_count_requests_and_transitions(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    await gateway.task()
    lease = (await worker.acquire()).body["lease"]
    await worker.write(lease, "progress")
    text = (await _metrics(gateway))
    assert 'leasehold_http_requests_total{method="POST",route="/v1/tasks/acquire",status="200"} 1.0' in text
    assert 'leasehold_lifecycle_transitions_total{event="TaskStarted"} 1.0' in text
    assert "lease_token" not in text


async def _metrics(gateway: RunningGateway) -> str:
    import ssl

    import aiohttp

    ctx = ssl.create_default_context(cafile=str(gateway.pki.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, \
            s.get(gateway.operator_url + "/metrics") as r:
        return await r.text()


async def test_gateway_seals_checkpoints_periodically(database_url: str, pki: object) -> None:

    from support.gateway import running_gateway

    async with running_gateway(database_url, pki, checkpoint_interval_seconds=0.2) as gw:  # type: ignore[arg-type]
        await gw.task()
        streams = await gw.count("SELECT count(DISTINCT originator_id) FROM events")
        # Waits for the loop to seal every stream (nothing writes meanwhile).
        async def sealed() -> bool:
            return await gw.count("SELECT coalesce(max(head_count), 0) FROM checkpoints") == streams

        await wait_until(sealed, 10, what="the checkpoint loop to seal every stream", interval=0.1)
