"""The Gateway application: ``create_app(settings)`` wires everything.

The pool, the LISTEN connection, the optional Redis hints (:mod:`gateway.background.hints`), the sweeper,
the scheduler and the metrics sampler live in ``cleanup_ctx`` (started before serving, cancelled
and awaited on shutdown). Routes come from the API modules'
route tables, which the OpenAPI document is generated from as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from datetime import timedelta

import psycopg
from aiohttp import web
from prometheus_client import Counter, Gauge
from psycopg_pool import PoolTimeout

from domain.errors import Unavailable
from gateway.api import operator as operator_api
from gateway.api import worker as worker_api
from gateway.api.http import (
    OBSERVE_REQUEST,
    Handler,
    Route,
    RouteTable,
    error_middleware,
    ok,
    request_log_middleware,
)
from gateway.api.openapi import build_openapi
from gateway.auth import BUCKETS, CERTIFICATES, KnownCertificates, TokenBuckets, ensure_bootstrap_admin_key
from gateway.background import scheduler, sweeper
from gateway.background.hints import HintingConnection, Hints
from gateway.background.notify import Notifier
from gateway.commands import Lifecycle, Registry
from gateway.commands.schedules import Schedules
from gateway.keys import LIFECYCLE, NOTIFIER, POOL, REGISTRY, SETTINGS
from gateway.metrics import Metrics
from gateway.settings import GatewaySettings
from persistence.checkpoints import write_checkpoint
from persistence.connection import create_pool

log = logging.getLogger("leasehold.gateway")

METRICS = web.AppKey("metrics", Metrics)
ROUTES = web.AppKey("routes", list)
HINTS = web.AppKey("hints", Hints)

service_routes = RouteTable()


@service_routes.route("GET", "/healthz", summary="Liveness: the process is up", auth="none", tags=("service",))
async def healthz(request: web.Request) -> web.StreamResponse:
    return ok({"status": "ok", "pid": os.getpid()})


@service_routes.route("GET", "/readyz", summary="Readiness: the database answers", auth="none",
                      statuses=(200, 503), tags=("service",))
async def readyz(request: web.Request) -> web.StreamResponse:
    try:
        async with asyncio.timeout(2):
            async with request.app[POOL].connection() as conn:
                await conn.execute("SELECT 1")
    except Exception as exc:
        raise Unavailable("the database does not answer") from exc
    return ok({"status": "ready", "listening": request.app[NOTIFIER].connected.is_set(),
               "redis": _redis_state(request.app)})


def _redis_state(app: web.Application) -> str:
    """``off`` (no ``redis_url``), ``connected`` or ``unavailable`` (the Gateway works without it)."""
    hints = app.get(HINTS)
    return "off" if hints is None else "connected" if hints.connected else "unavailable"


@service_routes.route("GET", "/metrics", summary="Prometheus metrics of this process", auth="none",
                      tags=("service",))
async def metrics(request: web.Request) -> web.StreamResponse:
    return web.Response(body=request.app[METRICS].render(), content_type="text/plain", charset="utf-8")


@service_routes.route("GET", "/openapi.json", summary="This API's OpenAPI 3.1 document", auth="none",
                      tags=("service",))
async def openapi(request: web.Request) -> web.StreamResponse:
    return ok(build_openapi(request.app[ROUTES]))


async def _resources(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    url = settings.resolved_database_url()
    notifier = Notifier(url)
    hints = None
    pool_hooks: dict[str, object] = {}
    if settings.redis_url:
        hints = Hints(settings.redis_url, notifier.dispatch, registry=app[METRICS].registry)
        app[HINTS] = hints
        # Connections remember what their transaction NOTIFYed; the pool hands it to Redis on return.
        pool_hooks = {"connection_class": HintingConnection, "reset": hints.reset}
    pool = create_pool(url, min_size=2, max_size=settings.pool_size, **pool_hooks)
    await pool.open(wait=False)
    app[POOL] = pool
    lifecycle = Lifecycle(pool, cancel_grace=timedelta(seconds=settings.cancel_grace_seconds))
    lifecycle.observe = app[METRICS].count_events
    app[LIFECYCLE] = lifecycle
    app[REGISTRY] = Registry(pool)
    # A lost LISTEN connection means the database went away: once it is back, drop the pool's
    # dead idle connections at once, rather than letting requests find them one by one.
    notifier.on_reconnect = pool.check
    if settings.listen:
        notifier.start()
    app[NOTIFIER] = notifier
    registry = app[METRICS].registry
    Gauge("leasehold_listen_connected", "1 while the LISTEN connection is up",
          registry=registry).set_function(lambda: 1 if notifier.connected.is_set() else 0)
    Gauge("leasehold_long_polls_waiting", "Acquire long-polls waiting for a wake-up",
          registry=registry).set_function(lambda: notifier.waiting)
    if hints is not None:
        hints.start()
    try:
        await ensure_bootstrap_admin_key(app)
    except Exception:  # the database may not be up yet; the Gateway still starts and retries per request
        log.exception("could not store the bootstrap administrator key")
    loops = [
        asyncio.create_task(sweeper.run(lifecycle, settings.sweep_interval_seconds, app[METRICS].swept.inc),
                            name="leasehold-sweeper"),
        asyncio.create_task(_sample_live_leases(app), name="leasehold-sampler"),
    ]
    if settings.checkpoint_interval_seconds > 0:
        loops.append(asyncio.create_task(_checkpoints(app, settings.checkpoint_interval_seconds),
                                         name="leasehold-checkpoints"))
    if settings.schedule_interval_seconds > 0:
        failures = Counter("leasehold_schedule_failures_total",
                           "Due schedules whose scan could not be created (rolled back and backed off)",
                           registry=registry)
        schedules = Schedules(pool, on_failure=lambda _: failures.inc())
        loops.append(asyncio.create_task(scheduler.run(schedules, settings.schedule_interval_seconds),
                                         name="leasehold-scheduler"))
    try:
        yield
    finally:
        for task in loops:
            task.cancel()
        for task in loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if hints is not None:
            await hints.stop()
        await notifier.stop()
        await pool.close()


async def _sample_live_leases(app: web.Application, every: float = 5.0) -> None:
    while True:
        with contextlib.suppress(Exception):
            async with app[POOL].connection() as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM worker_task_attempts WHERE status IN ('leased', 'running')")
                row = await cur.fetchone()
                app[METRICS].live_leases.set(row[0] if row else 0)
        await asyncio.sleep(every)


async def _checkpoints(app: web.Application, every: float) -> None:
    """Seal the heads of all streams periodically, so a truncated stream is detectable."""
    while True:
        await asyncio.sleep(every)
        try:
            async with app[POOL].connection() as conn:
                checkpoint = await write_checkpoint(conn)
            log.info("checkpoint", extra={"checkpoint": checkpoint.id, "seal": checkpoint.seal.hex()})
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("checkpoint failed; retrying at the next interval")


@web.middleware
async def database_outage_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A request that meets a lost database connection (a restart, a failover) answers 503, to
    be retried, rather than 500: reads outside a command's unit of work use pool connections
    directly, and right after a restart some of those are dead until the pool replaces them."""
    try:
        return await handler(request)
    except (psycopg.OperationalError, PoolTimeout) as exc:
        raise Unavailable("the database is unavailable") from exc


def create_app(settings: GatewaySettings) -> web.Application:
    """The Gateway as an aiohttp application (serve it with :mod:`gateway.serve`)."""
    app = web.Application(middlewares=[request_log_middleware, error_middleware, database_outage_middleware],
                          client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[OBSERVE_REQUEST] = app[METRICS].observe_request
    app[BUCKETS] = TokenBuckets(settings.rate_limit_per_second, settings.rate_limit_burst)
    app[CERTIFICATES] = KnownCertificates()
    routes: list[Route] = [*service_routes, *worker_api.routes, *operator_api.routes]
    app[ROUTES] = routes
    for route in routes:
        app.router.add_route(route.method, route.path, route.handler)
    app.cleanup_ctx.append(_resources)
    return app
