"""Service endpoints: liveness and readiness on every listener (the plain-HTTP health port
included), the OpenAPI document on the worker and operator ports, metrics on the operator port
only."""

from __future__ import annotations

import asyncio
import contextlib
import os

from aiohttp import web

from leasehold.domain.errors import LeaseholdError, Unavailable
from leasehold.gateway.api.http import Listener, RouteTable, ok
from leasehold.gateway.api.openapi import build_openapi
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.keys import HINTS, METRICS, NOTIFIER, ROUTES, SERVICES
from leasehold.gateway.schema import schema_status

routes = RouteTable()


PROBES: tuple[Listener, ...] = ("worker", "operator", "health")


@routes.route("GET", "/healthz", summary="Liveness: the process is up", auth="none", tags=("service",),
              listeners=PROBES)
async def healthz(request: web.Request) -> web.StreamResponse:
    return ok({"status": "ok", "pid": os.getpid()})


@routes.route("GET", "/readyz", summary="Readiness: the database answers at the expected schema revision",
              auth="none", statuses=(200, 503), tags=("service",), listeners=PROBES)
async def readyz(request: web.Request) -> web.StreamResponse:
    try:
        async with asyncio.timeout(2):
            schema = await schema_status(request.app[SERVICES].db)
    except Exception as exc:
        raise Unavailable("the database does not answer") from exc
    problem = schema.problem()
    if problem is not None:
        raise Unavailable(problem, schema=schema.as_json())
    return ok({"status": "ready", "listening": request.app[NOTIFIER].connected.is_set(),
               "redis": _redis_state(request.app), "schema": schema.as_json()})


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
