"""The operator API: workers."""

from __future__ import annotations

from uuid import UUID

from aiohttp import web

from leasehold.gateway.api.http import RouteTable, ok, read_json, read_query
from leasehold.gateway.api.operator.common import (
    TAGS,
    WORKER_PATH,
    _next_after,
    _path_id,
    _services,
    _workers,
    log,
    read_worker,
    reads,
)
from leasehold.gateway.api.operator_models import (
    NO_TASK_TYPES,
    PageQuery,
    RegisterWorker,
    Revocation,
    RevokeWorker,
    UpdateWorker,
    Worker,
    WorkerPage,
    WorkersQuery,
)
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.identity import Operator
from leasehold.gateway.keys import SETTINGS

routes = RouteTable()


@routes.route("POST", "/v1/workers", summary="Register a worker by its certificate fingerprint (administrator)",
              auth="operator", request=RegisterWorker, response=Worker, statuses=(201,), tags=TAGS)
async def register_worker(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    operator.require_admin()
    body = await read_json(request, RegisterWorker)
    worker_id = await _services(request).registry.register_worker(
        name=body.name, fingerprint=body.fingerprint, capabilities=tuple(body.capabilities),
        task_types=tuple(body.task_types), max_concurrent_tasks=body.max_concurrent_tasks, actor=operator.actor)
    if not body.task_types:
        log.warning("worker registered without task types: it is never offered a task",
                    extra={"worker_id": str(worker_id), "warning": NO_TASK_TYPES})
    return ok(await read_worker(request, operator, worker_id), status=201)


@routes.route("GET", "/v1/workers", summary="List workers (an organisation key: those assigned to it)",
              auth="operator", query=WorkersQuery, response=WorkerPage, tags=TAGS)
async def list_workers(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await workers_page(request, operator, read_query(request, WorkersQuery)))


async def workers_page(request: web.Request, operator: Operator, page: PageQuery, *,
                       with_leases: bool = True) -> WorkerPage:
    """One page of the workers ``operator`` may see, in id order (with ``page.liveness``, of
    those in that state)."""
    settings = request.app[SETTINGS]
    async with reads(request).read() as reader:
        rows = await reader.all("workers_page", {
            "after": page.after, "organization_id": operator.organization_id, "limit": page.limit + 1,
            "liveness": page.liveness if isinstance(page, WorkersQuery) else None, "now": None,
            "live_seconds": settings.worker_live_seconds, "idle_seconds": settings.worker_idle_seconds})
        items = await _workers(reader, operator, rows, settings, with_leases=with_leases) if rows else []
    return WorkerPage(items=items[:page.limit], next_after=_next_after(items, page.limit))


@routes.route("GET", WORKER_PATH, summary="Read a worker", auth="operator", response=Worker, tags=TAGS)
async def get_worker(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await read_worker(request, operator, _path_id(request, "worker_id", "worker")))


@routes.route("PATCH", WORKER_PATH, summary="Change capabilities, task types or capacity (administrator)",
              auth="operator", request=UpdateWorker, response=Worker, tags=TAGS)
async def update_worker(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    worker_id = _path_id(request, "worker_id", "worker")
    await read_worker(request, operator, worker_id)
    operator.require_admin()
    body = await read_json(request, UpdateWorker)
    await _services(request).registry.update_worker(
        worker_id, capabilities=None if body.capabilities is None else tuple(body.capabilities),
        task_types=None if body.task_types is None else tuple(body.task_types),
        max_concurrent_tasks=body.max_concurrent_tasks, actor=operator.actor)
    return ok(await read_worker(request, operator, worker_id))


async def _set_enabled(request: web.Request, enabled: bool) -> web.StreamResponse:
    operator = await operator_identity(request)
    worker_id = _path_id(request, "worker_id", "worker")
    return ok(await set_worker_enabled(request, operator, worker_id, enabled))


async def set_worker_enabled(request: web.Request, operator: Operator, worker_id: UUID, enabled: bool) -> Worker:
    """Enable or disable a worker (404 unless visible, then 403 unless administrator); disabling
    ends its active attempts at once."""
    await read_worker(request, operator, worker_id)
    operator.require_admin()
    await _services(request).registry.set_worker_enabled(worker_id, enabled, actor=operator.actor)
    if not enabled:
        await _services(request).lifecycle.cancel_worker_attempts(
            worker_id, reason="worker disabled", actor=operator.actor, at_once=True)
    return await read_worker(request, operator, worker_id)


@routes.route("POST", WORKER_PATH + "/enable", summary="Enable a worker (administrator)", auth="operator",
              response=Worker, tags=TAGS)
async def enable_worker(request: web.Request) -> web.StreamResponse:
    return await _set_enabled(request, True)


@routes.route("POST", WORKER_PATH + "/disable",
              summary="Disable a worker: refused from its next request on; its active attempts end at once "
                      "and their tasks are retried elsewhere (administrator; repeating it finishes an "
                      "interrupted disable)", auth="operator",
              response=Worker, tags=TAGS)
async def disable_worker(request: web.Request) -> web.StreamResponse:
    return await _set_enabled(request, False)


@routes.route("POST", WORKER_PATH + "/revoke",
              summary="Revoke a worker for good and cancel its active tasks (administrator)", auth="operator",
              request=RevokeWorker, response=Revocation, tags=TAGS)
async def revoke_worker(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    worker_id = _path_id(request, "worker_id", "worker")
    await read_worker(request, operator, worker_id)
    operator.require_admin()
    body = await read_json(request, RevokeWorker)
    return ok(await revoke_worker_for_good(request, operator, worker_id, body.reason))


async def revoke_worker_for_good(request: web.Request, operator: Operator, worker_id: UUID,
                                 reason: str) -> Revocation:
    """Revoke a worker and cancel its active tasks (404 unless visible, then 403 unless administrator)."""
    await read_worker(request, operator, worker_id)
    operator.require_admin()
    await _services(request).registry.revoke_worker(worker_id, reason=reason, actor=operator.actor)
    cancelled = await _services(request).lifecycle.cancel_worker_attempts(
        worker_id, reason=f"worker revoked: {reason}", actor=operator.actor)
    return Revocation(worker=await read_worker(request, operator, worker_id), cancelled_task_ids=cancelled)


