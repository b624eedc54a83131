"""Service endpoints: liveness and readiness on every listener (the plain-HTTP health port
included), the OpenAPI document on the worker and operator ports, metrics on the operator port
only."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from aiohttp import web
from pydantic import BaseModel, Field

from leasehold.domain.errors import LeaseholdError, Unavailable
from leasehold.gateway import health
from leasehold.gateway.api.http import Listener, RouteTable, ok
from leasehold.gateway.api.openapi import build_openapi
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.keys import HINTS, METRICS, NOTIFIER, ROUTES, SERVICES
from leasehold.gateway.schema import SchemaStatus, schema_status

routes = RouteTable()


PROBES: tuple[Listener, ...] = ("worker", "operator", "health")


@routes.route("GET", "/healthz", summary="Liveness: the process is up", auth="none", tags=("service",),
              listeners=PROBES)
async def healthz(request: web.Request) -> web.StreamResponse:
    return ok({"status": "ok", "pid": os.getpid()})


@routes.route("GET", "/readyz", summary="Readiness: the database answers at the expected schema revision "
                                      "(status degraded, still 200: which dependencies are slow or down)",
              auth="none", statuses=(200, 503), tags=("service",), listeners=PROBES)
async def readyz(request: web.Request) -> web.StreamResponse:
    schema, checks = await _checks(request.app)
    slow = health.degraded(checks)
    return ok({"status": "degraded" if slow else "ready", "degraded": slow,
               "listening": request.app[NOTIFIER].connected.is_set(), "redis": _redis_state(request.app),
               "schema": schema.as_json()})


class HealthCheck(BaseModel):
    state: str = Field(description="ok, degraded (slow or down) or off (not configured)")
    detail: str
    seconds: float | None = Field(description="what the state was judged on: round trip, seal age, partitions "
                                              "ahead (seconds)")


class Health(BaseModel):
    """Which dependency of the answering Gateway process is slow or down."""

    status: str = Field(description="ready, or degraded when a check is")
    degraded: list[str] = Field(description="the checks that are degraded")
    pid: int
    checks: dict[str, HealthCheck] = Field(description="database, listen, redis, digest_sink, partitions")


@routes.route("GET", "/v1/health", summary="Health detail: which dependency is slow or down (database round trip, "
                                          "LISTEN, Redis, digest sink, event log partitions)",
              auth="none", response=Health, statuses=(503,), tags=("service",))
async def health_detail(request: web.Request) -> web.StreamResponse:
    # Like /metrics: anyone who reaches the operator port; it names dependencies, never organisations.
    _, checks = await _checks(request.app)
    slow = health.degraded(checks)
    return ok(Health(status="degraded" if slow else "ready", degraded=slow, pid=os.getpid(),
                     checks={name: HealthCheck(state=c.state, detail=c.detail, seconds=c.seconds)
                             for name, c in checks.items()}))


async def _schema(app: web.Application) -> SchemaStatus:
    """The schema revision the database is at; 503 when it does not answer or is not the one expected."""
    try:
        async with asyncio.timeout(2):
            schema = await schema_status(app[SERVICES].db)
    except Exception as exc:
        raise Unavailable("the database does not answer") from exc
    problem = schema.problem()
    if problem is not None:
        raise Unavailable(problem, schema=schema.as_json())
    return schema


async def _checks(app: web.Application) -> tuple[SchemaStatus, dict[str, health.Check]]:
    """The schema status and the checks, the database's judged on that round trip (503 when it fails)."""
    started = time.perf_counter()
    schema = await _schema(app)
    return schema, health.assess(app, database_latency=time.perf_counter() - started)


def _redis_state(app: web.Application) -> str:
    """``off`` (no ``redis_url``), ``connected`` or ``unavailable`` (the Gateway works without it)."""
    hints = app.get(HINTS)
    return "off" if hints is None else "connected" if hints.connected else "unavailable"


@routes.route("GET", "/metrics", summary="Prometheus metrics of this process (operator port)", auth="none",
              tags=("service",))
async def metrics(request: web.Request) -> web.StreamResponse:
    # Anyone who reaches the operator port may scrape; the series that name organisations only
    # go to an administrator key (a bearer token in the scrape configuration).
    admin = False
    if request.headers.get("Authorization"):
        with contextlib.suppress(LeaseholdError):
            admin = (await operator_identity(request)).is_admin
    return web.Response(body=request.app[METRICS].render(by_organization=admin), content_type="text/plain",
                        charset="utf-8")


@routes.route("GET", "/openapi.json", summary="This API's OpenAPI 3.1 document", auth="none", tags=("service",),
              listeners=("worker", "operator"))
async def openapi(request: web.Request) -> web.StreamResponse:
    return ok(build_openapi(request.app[ROUTES]))
