"""The operator API: scans and tasks."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from aiohttp import web
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from leasehold.domain.errors import InvalidRequest
from leasehold.domain.targets import targets_of
from leasehold.gateway.api.http import RouteTable, idempotency_key, ok, read_json, read_query
from leasehold.gateway.api.operator.common import (
    _EVENT_POSITION,
    TAGS,
    TASK_PATH,
    _links,
    _path_id,
    _see_organization,
    _services,
    read_scan,
    read_task,
    reads,
    see_task,
)
from leasehold.gateway.api.operator.profiles import _steps
from leasehold.gateway.api.operator_models import (
    Asset,
    AssetList,
    CancelScan,
    CancelTask,
    CreateScan,
    CreateTask,
    Event,
    EventPage,
    EventsQuery,
    FindingsQuery,
    Scan,
    ScanCancellation,
    Task,
    Threat,
    ThreatList,
    clip,
    redact,
)
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.commands.idempotency import AlreadyCreated, IdempotencyKey
from leasehold.gateway.commands.lifecycle import TaskSpec
from leasehold.gateway.identity import Operator
from leasehold.persistence.event_log import decode_event

routes = RouteTable()


def require_targets(targets: dict[str, Any], has_steps: bool) -> None:
    """Targets of a scan (or schedule) with steps that name keys but select nothing to scan are
    refused: every step would run on nothing and the scan "succeed". A misspelt key (``hosts``
    for ``targets``) is the usual cause, so the answer names the keys it got. Empty targets stay
    allowed (plugins that need no target); ``targets`` or ``assets`` select something."""
    if not has_steps or not targets or targets_of(targets) or targets.get("assets"):
        return
    raise InvalidRequest(f"targets select nothing to scan (they have {', '.join(sorted(map(str, targets)))}): "
                         'give {"targets": ["192.0.2.10", "example.com", …]} or "assets"')


@routes.route("POST", "/v1/scans", summary="Create a scan of an organisation (an organisation key: its own)",
              auth="operator", request=CreateScan, response=Scan, statuses=(201,), tags=TAGS, idempotent=True,
              links=_links("scan_id", "get_scan_get", "create_task_post", "cancel_scan_post", "scan_assets_get"))
async def create_scan(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    key = idempotency_key(request)
    body = await read_json(request, CreateScan)
    org_id = body.organization_id or operator.organization_id
    if org_id is None:
        raise InvalidRequest("organization_id is required with an administrator key")
    _see_organization(operator, org_id)
    require_targets(body.targets, has_steps=bool(body.profile))
    try:
        scan_id = await _services(request).scans.create_scan(
            org_id, body.targets, profile=() if isinstance(body.profile, str) else _steps(body.profile),
            profile_name=body.profile if isinstance(body.profile, str) else None,
            legacy_scan_id=body.legacy_scan_id, actor=operator.actor,
            idempotency=_idempotency(request, operator, key, "create_scan", body))
    except AlreadyCreated as first:
        scan_id = first.resource_id
    return ok(await read_scan(request, operator, scan_id), status=201)


def _idempotency(request: web.Request, operator: Operator, key: str | None, operation: str,
                 body: BaseModel) -> IdempotencyKey | None:
    """The request's idempotency key, scoped to the caller's organisation (or the administrators)."""
    if key is None:
        return None
    return IdempotencyKey.of(organization_id=operator.organization_id, key=key, operation=operation,
                             method=request.method, path=request.path, body=body.model_dump(mode="json"))


@routes.route("GET", "/v1/scans/{scan_id}", summary="Read a scan", auth="operator", response=Scan, tags=TAGS)
async def get_scan(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await read_scan(request, operator, _path_id(request, "scan_id", "scan")))


@routes.route("POST", "/v1/scans/{scan_id}/tasks", summary="Queue a job on the scan and create its task",
              auth="operator", request=CreateTask, response=Task, statuses=(201,), tags=TAGS, idempotent=True,
              links=_links("task_id", "get_task_get", "task_events_get", "cancel_task_post"))
async def create_task(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    key = idempotency_key(request)
    scan_id = _path_id(request, "scan_id", "scan")
    await read_scan(request, operator, scan_id)
    body = await read_json(request, CreateTask)
    try:
        task = await _services(request).lifecycle.create_task(scan_id, TaskSpec(
            task_type=body.task_type, plugin=body.plugin, required_capabilities=tuple(body.required_capabilities),
            priority=body.priority, scope=body.scope, parameters=body.parameters, max_attempts=body.max_attempts,
            lease_seconds=body.lease_seconds, execution_timeout_seconds=body.execution_timeout_seconds),
            actor=operator.actor, idempotency=_idempotency(request, operator, key, "create_task", body))
    except AlreadyCreated as first:
        return ok(await read_task(request, operator, first.resource_id), status=201)
    return ok(Task.of(task, []), status=201)


@routes.route("POST", "/v1/scans/{scan_id}/cancel",
              summary="Cancel a scan: no further profile steps; each unfinished task is cancelled",
              auth="operator", request=CancelScan, response=ScanCancellation, tags=TAGS)
async def cancel_scan(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    scan_id = _path_id(request, "scan_id", "scan")
    await read_scan(request, operator, scan_id)
    body = await read_json(request, CancelScan)
    tasks = await _services(request).scans.cancel_scan(scan_id, reason=body.reason, actor=operator.actor)
    return ok(ScanCancellation(scan_id=scan_id, tasks=[{"id": str(t.id), "state": t.state} for t in tasks]))


async def _findings(request: web.Request, query_name: str, **params: Any) -> list[Any]:
    """Rows of a findings query (assets, threats), limited by the request's ``?limit=``."""
    query = read_query(request, FindingsQuery)
    async with reads(request).read() as reader:
        return await reader.all(query_name, {**params, "limit": query.limit})


@routes.route("GET", "/v1/scans/{scan_id}/assets", summary="The assets a scan found", auth="operator",
              query=FindingsQuery, response=AssetList, tags=TAGS)
async def scan_assets(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    scan_id = _path_id(request, "scan_id", "scan")
    await read_scan(request, operator, scan_id)
    rows = await _findings(request, "scan_assets", scan_id=scan_id)
    return ok(AssetList(items=[Asset.of(r) for r in rows]))


@routes.route("GET", "/v1/organizations/{organization_id}/assets", summary="An organisation's assets",
              auth="operator", query=FindingsQuery, response=AssetList, tags=TAGS)
async def organization_assets(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    org_id = _path_id(request, "organization_id", "organisation")
    _see_organization(operator, org_id)
    rows = await _findings(request, "organization_assets", organization_id=org_id)
    return ok(AssetList(items=[Asset.of(r) for r in rows]))


@routes.route("GET", "/v1/organizations/{organization_id}/threats", summary="An organisation's threats",
              auth="operator", query=FindingsQuery, response=ThreatList, tags=TAGS)
async def organization_threats(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    org_id = _path_id(request, "organization_id", "organisation")
    _see_organization(operator, org_id)
    rows = await _findings(request, "organization_threats", organization_id=org_id)
    return ok(ThreatList(items=[Threat.of(r) for r in rows]))


@routes.route("GET", TASK_PATH, summary="Read a task with all its attempts", auth="operator", response=Task,
              tags=TAGS)
async def get_task(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await read_task(request, operator, _path_id(request, "task_id", "task")))


@routes.route("POST", TASK_PATH + "/cancel",
              summary="Cancel a task (before a lease: at once; leased or running: the worker is told to stop)",
              auth="operator", request=CancelTask, response=Task, tags=TAGS)
async def cancel_task(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    task_id = _path_id(request, "task_id", "task")
    await see_task(request, operator, task_id)
    body = await read_json(request, CancelTask)
    await _services(request).lifecycle.request_cancel(task_id, reason=body.reason, actor=operator.actor)
    return ok(await read_task(request, operator, task_id))


@routes.route("GET", TASK_PATH + "/events", summary="A task's history for auditors, oldest first",
              auth="operator", query=EventsQuery, response=EventPage, tags=TAGS)
async def task_events(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    task_id = _path_id(request, "task_id", "task")
    await see_task(request, operator, task_id)
    return ok(await event_page(request, task_id, read_query(request, EventsQuery)))


async def event_page(request: web.Request, task_id: UUID, page: EventsQuery) -> EventPage:
    """A page of the task's events, decoded and redacted (the caller checked visibility)."""
    async with reads(request).read() as reader:
        rows = await reader.all("events_of_stream", {
            "originator_id": task_id, "after_version": page.after_version, "limit": page.limit + 1})
    items = []
    for stored in rows[:page.limit]:
        version, topic, recorded_at = stored.originator_version, stored.topic, stored.recorded_at
        event = decode_event(stored.originator_id, version, topic, bytes(stored.state))
        # Clipped before it becomes JSON: a value stored before the input limits may nest deeper
        # than an answer can encode.
        payload, clipped = clip(event.model_dump(exclude=_EVENT_POSITION))
        items.append(Event(version=version, type=type(event).__name__, topic=topic, recorded_at=recorded_at,
                           occurred_at=event.timestamp, actor=event.actor,
                           payload=to_jsonable_python(redact(payload)), payload_clipped=clipped))
    more = len(rows) > page.limit
    return EventPage(items=items, next_after_version=max(e.version for e in items) if more else None)


