"""The operator API (bearer API keys): organisations, workers, assignments, scans and tasks.

Who sees what: an administrator key (no organisation) sees everything; an organisation key sees
its organisation, the workers actively assigned to it, and its scans and tasks. Anything else
answers 404, exactly as an id that does not exist, so a key never learns that another
organisation's resource exists. Administrator-only changes answer 403 to an organisation key,
but only for resources it can already see.

Order of checks in every handler: key (401), path ids and visibility (404), administrator (403),
body (400/422), then one service call per change (each its own transaction).

Revocation (RFC "Cancellation", assignment revocation defaults): new leases stop as soon as the
revocation commits (acquire reads the worker and its assignments in its own transaction). A
security revocation — of the worker, or of an assignment — then cancels the worker's active
tasks (of that organisation), one transaction per task; repeating the request finishes a
revocation that was interrupted midway. A routine removal cancels them too unless
``finish_active=true`` lets them finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from aiohttp import web

from domain.errors import InvalidRequest, NotFound
from domain.events import ProfileStep
from gateway.api.http import RouteTable, ok, read_json, read_query
from gateway.api.operator_models import (
    AddAssignment,
    ApiKeyCreated,
    Asset,
    AssetList,
    AssignmentView,
    Attempt,
    CancelScan,
    CancelTask,
    CreateApiKey,
    CreateOrganization,
    CreateProfile,
    CreateScan,
    CreateSchedule,
    CreateTask,
    Event,
    EventPage,
    EventsQuery,
    FairShare,
    FindingsQuery,
    GatewayExecution,
    LegacyStatus,
    Organization,
    OrganizationPage,
    PageQuery,
    ProfileDeletion,
    ProfileStepBody,
    RegisterWorker,
    RemoveAssignmentQuery,
    ReplaceProfile,
    Revocation,
    RevokeAssignment,
    RevokeWorker,
    Scan,
    ScanCancellation,
    Schedule,
    ScheduleDeletion,
    SchedulePage,
    ScheduleRun,
    SetFairShare,
    StoredProfile,
    StoredProfilePage,
    Task,
    Threat,
    ThreatList,
    UpdateWorker,
    Worker,
    WorkerPage,
    redact,
)
from gateway.auth import operator_identity
from gateway.commands.lifecycle import TaskSpec
from gateway.identity import Operator
from gateway.keys import SERVICES
from gateway.services import Services
from persistence.event_log import decode_event
from persistence.task_rows import task_from_row
from persistence.transaction import Reader

routes = RouteTable()
TAGS = ("operator",)

# A task id is a UUID: the pattern keeps GET /v1/tasks/acquire (a worker route) a 405, not a 404.
TASK_PATH = "/v1/tasks/{task_id:[0-9a-fA-F-]+}"
WORKER_PATH = "/v1/workers/{worker_id}"
ASSIGNMENT_PATH = WORKER_PATH + "/assignments/{organization_id}"
_EVENT_POSITION = {"originator_id", "originator_version", "timestamp", "actor"}


def _links(parameter: str, *operation_ids: str) -> dict[str, dict[str, Any]]:
    """OpenAPI links from a created resource (its ``id``) to the operations that take it."""
    return {op: {"operationId": op, "parameters": {parameter: "$response.body#/id"}} for op in operation_ids}


# --- reading (no transactions of their own that write; every read checks visibility) --------


def _services(request: web.Request) -> Services:
    return request.app[SERVICES]


def _path_id(request: web.Request, name: str, what: str) -> UUID:
    try:
        return UUID(request.match_info[name])
    except ValueError as exc:
        raise NotFound(f"no such {what}") from exc


def _see_organization(operator: Operator, organization_id: UUID) -> None:
    if not operator.can_see(organization_id):
        raise NotFound("no such organisation", organization_id=str(organization_id))


async def _organization(request: web.Request, operator: Operator, organization_id: UUID) -> Organization:
    _see_organization(operator, organization_id)
    async with _services(request).db.read() as reader:
        row = await reader.one("organization_get", {"organization_id": organization_id})
    if row is None:
        raise NotFound("no such organisation", organization_id=str(organization_id))
    return Organization.of(row)


async def _workers(reader: Reader, operator: Operator, rows: list[Any]) -> list[Worker]:
    assignments: dict[UUID, list[AssignmentView]] = {}
    for a in await reader.all("assignments_of_workers", {"worker_ids": [r[0] for r in rows],
                                                         "organization_id": operator.organization_id}):
        assignments.setdefault(a[0], []).append(AssignmentView.of(a))
    return [Worker.of(r, assignments.get(r[0], [])) for r in rows]


async def _worker(request: web.Request, operator: Operator, worker_id: UUID) -> Worker:
    """The worker as ``operator`` may see it; 404 when it does not exist or is not theirs."""
    async with _services(request).db.read() as reader:
        row = await reader.one("worker_get", {"worker_id": worker_id, "organization_id": operator.organization_id})
        if row is None:
            raise NotFound("no such worker", worker_id=str(worker_id))
        (worker,) = await _workers(reader, operator, [row])
    return worker


async def _scan(request: web.Request, operator: Operator, scan_id: UUID) -> Scan:
    async with _services(request).db.read() as reader:
        row = await reader.one("scan_get", {"scan_id": scan_id})
    if row is None or not operator.can_see(row[1]):
        raise NotFound("no such scan", scan_id=str(scan_id))
    return Scan.of(row)


async def _see_task(request: web.Request, operator: Operator, task_id: UUID) -> None:
    async with _services(request).db.read() as reader:
        row = await reader.one("task_organization", {"task_id": task_id})
    if row is None or not operator.can_see(row[0]):
        raise NotFound("no such task", task_id=str(task_id))


async def _task(request: web.Request, operator: Operator, task_id: UUID) -> Task:
    """The task with every attempt, read in one snapshot."""
    async with _services(request).db.snapshot() as reader:
        row = await reader.one("task_get", {"task_id": task_id})
        if row is None or not operator.can_see(row[5]):
            raise NotFound("no such task", task_id=str(task_id))
        task, _ = task_from_row(row)
        attempts = [Attempt.from_row(a) for a in await reader.all("attempts_of_task", {"task_id": task_id})]
    return Task.of(task, attempts)


def _next_after(items: list[Any], limit: int) -> UUID | None:
    return items[limit - 1].id if len(items) > limit else None


# --- organisations ----------------------------------------------------------------------------


@routes.route("POST", "/v1/organizations", summary="Create an organisation (administrator)", auth="operator",
              request=CreateOrganization, response=Organization, statuses=(201,), tags=TAGS)
async def create_organization(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    operator.require_admin()
    body = await read_json(request, CreateOrganization)
    org_id = await _services(request).registry.create_organization(body.name, actor=operator.actor)
    return ok(await _organization(request, operator, org_id), status=201)


@routes.route("GET", "/v1/organizations", summary="List organisations (an organisation key: its own)",
              auth="operator", query=PageQuery, response=OrganizationPage, tags=TAGS)
async def list_organizations(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    page = read_query(request, PageQuery)
    async with _services(request).db.read() as reader:
        items = [Organization.of(r) for r in await reader.all("organizations_page", {
            "after": page.after, "visible_to": operator.organization_id, "limit": page.limit + 1})]
    return ok(OrganizationPage(items=items[:page.limit], next_after=_next_after(items, page.limit)))


@routes.route("GET", "/v1/organizations/{organization_id}", summary="Read an organisation", auth="operator",
              response=Organization, tags=TAGS)
async def get_organization(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    org_id = _path_id(request, "organization_id", "organisation")
    return ok(await _organization(request, operator, org_id))


@routes.route("POST", "/v1/organizations/{organization_id}/api-keys",
              summary="Create an API key of the organisation (administrator; the key is shown once)",
              auth="operator", request=CreateApiKey, response=ApiKeyCreated, statuses=(201,), tags=TAGS)
async def create_organization_key(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    org_id = _path_id(request, "organization_id", "organisation")
    await _organization(request, operator, org_id)
    operator.require_admin()
    body = await read_json(request, CreateApiKey)
    issued = await _services(request).registry.create_api_key(organization_id=org_id, name=body.name)
    return ok(ApiKeyCreated(id=issued.id, name=issued.name, organization_id=issued.organization_id,
                            key=issued.key), status=201)


# --- workers ----------------------------------------------------------------------------------


@routes.route("POST", "/v1/workers", summary="Register a worker by its certificate fingerprint (administrator)",
              auth="operator", request=RegisterWorker, response=Worker, statuses=(201,), tags=TAGS)
async def register_worker(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    operator.require_admin()
    body = await read_json(request, RegisterWorker)
    worker_id = await _services(request).registry.register_worker(
        name=body.name, fingerprint=body.fingerprint, capabilities=tuple(body.capabilities),
        task_types=tuple(body.task_types), max_concurrent_tasks=body.max_concurrent_tasks, actor=operator.actor)
    return ok(await _worker(request, operator, worker_id), status=201)


@routes.route("GET", "/v1/workers", summary="List workers (an organisation key: those assigned to it)",
              auth="operator", query=PageQuery, response=WorkerPage, tags=TAGS)
async def list_workers(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    page = read_query(request, PageQuery)
    async with _services(request).db.read() as reader:
        rows = await reader.all("workers_page", {
            "after": page.after, "organization_id": operator.organization_id, "limit": page.limit + 1})
        items = await _workers(reader, operator, rows) if rows else []
    return ok(WorkerPage(items=items[:page.limit], next_after=_next_after(items, page.limit)))


@routes.route("GET", WORKER_PATH, summary="Read a worker", auth="operator", response=Worker, tags=TAGS)
async def get_worker(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await _worker(request, operator, _path_id(request, "worker_id", "worker")))


@routes.route("PATCH", WORKER_PATH, summary="Change capabilities, task types or capacity (administrator)",
              auth="operator", request=UpdateWorker, response=Worker, tags=TAGS)
async def update_worker(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    worker_id = _path_id(request, "worker_id", "worker")
    await _worker(request, operator, worker_id)
    operator.require_admin()
    body = await read_json(request, UpdateWorker)
    await _services(request).registry.update_worker(
        worker_id, capabilities=None if body.capabilities is None else tuple(body.capabilities),
        task_types=None if body.task_types is None else tuple(body.task_types),
        max_concurrent_tasks=body.max_concurrent_tasks, actor=operator.actor)
    return ok(await _worker(request, operator, worker_id))


async def _set_enabled(request: web.Request, enabled: bool) -> web.StreamResponse:
    operator = await operator_identity(request)
    worker_id = _path_id(request, "worker_id", "worker")
    await _worker(request, operator, worker_id)
    operator.require_admin()
    await _services(request).registry.set_worker_enabled(worker_id, enabled, actor=operator.actor)
    return ok(await _worker(request, operator, worker_id))


@routes.route("POST", WORKER_PATH + "/enable", summary="Enable a worker (administrator)", auth="operator",
              response=Worker, tags=TAGS)
async def enable_worker(request: web.Request) -> web.StreamResponse:
    return await _set_enabled(request, True)


@routes.route("POST", WORKER_PATH + "/disable",
              summary="Disable a worker: refused from its next request on (administrator)", auth="operator",
              response=Worker, tags=TAGS)
async def disable_worker(request: web.Request) -> web.StreamResponse:
    return await _set_enabled(request, False)


@routes.route("POST", WORKER_PATH + "/revoke",
              summary="Revoke a worker for good and cancel its active tasks (administrator)", auth="operator",
              request=RevokeWorker, response=Revocation, tags=TAGS)
async def revoke_worker(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    worker_id = _path_id(request, "worker_id", "worker")
    await _worker(request, operator, worker_id)
    operator.require_admin()
    body = await read_json(request, RevokeWorker)
    await _services(request).registry.revoke_worker(worker_id, reason=body.reason, actor=operator.actor)
    cancelled = await _services(request).lifecycle.cancel_worker_attempts(
        worker_id, reason=f"worker revoked: {body.reason}", actor=operator.actor)
    return ok(Revocation(worker=await _worker(request, operator, worker_id), cancelled_task_ids=cancelled))


# --- assignments ------------------------------------------------------------------------------


@routes.route("POST", WORKER_PATH + "/assignments",
              summary="Assign a worker to an organisation (administrator; repeating it is a no-op)",
              auth="operator", request=AddAssignment, response=Worker, tags=TAGS)
async def add_assignment(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    worker_id = _path_id(request, "worker_id", "worker")
    await _worker(request, operator, worker_id)
    body = await read_json(request, AddAssignment)
    _see_organization(operator, body.organization_id)
    operator.require_admin()
    await _services(request).registry.assign_worker(worker_id, body.organization_id, actor=operator.actor)
    return ok(await _worker(request, operator, worker_id))


async def _assignment_ids(request: web.Request) -> tuple[Operator, UUID, UUID]:
    operator = await operator_identity(request)
    worker_id = _path_id(request, "worker_id", "worker")
    org_id = _path_id(request, "organization_id", "organisation")
    await _worker(request, operator, worker_id)
    _see_organization(operator, org_id)
    operator.require_admin()
    return operator, worker_id, org_id


@routes.route("DELETE", ASSIGNMENT_PATH,
              summary="Remove an assignment: new leases stop; active tasks are cancelled unless "
                      "finish_active=true (administrator)",
              auth="operator", query=RemoveAssignmentQuery, response=Revocation, tags=TAGS)
async def remove_assignment(request: web.Request) -> web.StreamResponse:
    operator, worker_id, org_id = await _assignment_ids(request)
    options = read_query(request, RemoveAssignmentQuery)
    await _services(request).registry.end_assignment(worker_id, org_id, revoke=False, actor=operator.actor)
    cancelled: list[UUID] = []
    if not options.finish_active:
        cancelled = await _services(request).lifecycle.cancel_worker_attempts(
            worker_id, organization_id=org_id, reason=f"worker removed from organisation {org_id}",
            actor=operator.actor)
    return ok(Revocation(worker=await _worker(request, operator, worker_id), cancelled_task_ids=cancelled))


@routes.route("POST", ASSIGNMENT_PATH + "/revoke",
              summary="Revoke an assignment: new leases stop and the organisation's active tasks on the "
                      "worker are cancelled (administrator)",
              auth="operator", request=RevokeAssignment, response=Revocation, tags=TAGS)
async def revoke_assignment(request: web.Request) -> web.StreamResponse:
    operator, worker_id, org_id = await _assignment_ids(request)
    body = await read_json(request, RevokeAssignment)
    await _services(request).registry.end_assignment(worker_id, org_id, revoke=True, actor=operator.actor)
    cancelled = await _services(request).lifecycle.cancel_worker_attempts(
        worker_id, organization_id=org_id, reason=f"assignment revoked: {body.reason}", actor=operator.actor)
    return ok(Revocation(worker=await _worker(request, operator, worker_id), cancelled_task_ids=cancelled))


# --- scans and tasks --------------------------------------------------------------------------


@routes.route("POST", "/v1/scans", summary="Create a scan of an organisation (an organisation key: its own)",
              auth="operator", request=CreateScan, response=Scan, statuses=(201,), tags=TAGS,
              links=_links("scan_id", "get_scan_get", "create_task_post", "cancel_scan_post", "scan_assets_get"))
async def create_scan(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    body = await read_json(request, CreateScan)
    org_id = body.organization_id or operator.organization_id
    if org_id is None:
        raise InvalidRequest("organization_id is required with an administrator key")
    _see_organization(operator, org_id)
    scan_id = await _services(request).scans.create_scan(
        org_id, body.targets, profile=() if isinstance(body.profile, str) else _steps(body.profile),
        profile_name=body.profile if isinstance(body.profile, str) else None,
        legacy_scan_id=body.legacy_scan_id, actor=operator.actor)
    return ok(await _scan(request, operator, scan_id), status=201)


@routes.route("GET", "/v1/scans/{scan_id}", summary="Read a scan", auth="operator", response=Scan, tags=TAGS)
async def get_scan(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await _scan(request, operator, _path_id(request, "scan_id", "scan")))


@routes.route("POST", "/v1/scans/{scan_id}/tasks", summary="Queue a job on the scan and create its task",
              auth="operator", request=CreateTask, response=Task, statuses=(201,), tags=TAGS,
              links=_links("task_id", "get_task_get", "task_events_get", "cancel_task_post"))
async def create_task(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    scan_id = _path_id(request, "scan_id", "scan")
    await _scan(request, operator, scan_id)
    body = await read_json(request, CreateTask)
    task = await _services(request).lifecycle.create_task(scan_id, TaskSpec(
        task_type=body.task_type, plugin=body.plugin, required_capabilities=tuple(body.required_capabilities),
        priority=body.priority, scope=body.scope, parameters=body.parameters, max_attempts=body.max_attempts,
        lease_seconds=body.lease_seconds, execution_timeout_seconds=body.execution_timeout_seconds),
        actor=operator.actor)
    return ok(Task.of(task, []), status=201)


@routes.route("POST", "/v1/scans/{scan_id}/cancel",
              summary="Cancel a scan: no further profile steps; each unfinished task is cancelled",
              auth="operator", request=CancelScan, response=ScanCancellation, tags=TAGS)
async def cancel_scan(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    scan_id = _path_id(request, "scan_id", "scan")
    await _scan(request, operator, scan_id)
    body = await read_json(request, CancelScan)
    tasks = await _services(request).scans.cancel_scan(scan_id, reason=body.reason, actor=operator.actor)
    return ok(ScanCancellation(scan_id=scan_id, tasks=[{"id": str(t.id), "state": t.state} for t in tasks]))


async def _findings(request: web.Request, query_name: str, **params: Any) -> list[Any]:
    """Rows of a findings query (assets, threats), limited by the request's ``?limit=``."""
    query = read_query(request, FindingsQuery)
    async with _services(request).db.read() as reader:
        return await reader.all(query_name, {**params, "limit": query.limit})


@routes.route("GET", "/v1/scans/{scan_id}/assets", summary="The assets a scan found", auth="operator",
              query=FindingsQuery, response=AssetList, tags=TAGS)
async def scan_assets(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    scan_id = _path_id(request, "scan_id", "scan")
    await _scan(request, operator, scan_id)
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
    return ok(await _task(request, operator, _path_id(request, "task_id", "task")))


@routes.route("POST", TASK_PATH + "/cancel",
              summary="Cancel a task (before a lease: at once; leased or running: the worker is told to stop)",
              auth="operator", request=CancelTask, response=Task, tags=TAGS)
async def cancel_task(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    task_id = _path_id(request, "task_id", "task")
    await _see_task(request, operator, task_id)
    body = await read_json(request, CancelTask)
    await _services(request).lifecycle.request_cancel(task_id, reason=body.reason, actor=operator.actor)
    return ok(await _task(request, operator, task_id))


@routes.route("GET", TASK_PATH + "/events", summary="A task's history for auditors, oldest first",
              auth="operator", query=EventsQuery, response=EventPage, tags=TAGS)
async def task_events(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    task_id = _path_id(request, "task_id", "task")
    await _see_task(request, operator, task_id)
    page = read_query(request, EventsQuery)
    async with _services(request).db.read() as reader:
        rows = await reader.all("events_of_stream", {
            "originator_id": task_id, "after_version": page.after_version, "limit": page.limit + 1})
    items = []
    for originator_id, version, topic, state, recorded_at in rows[:page.limit]:
        event = decode_event(originator_id, version, topic, bytes(state))
        items.append(Event(version=version, type=type(event).__name__, topic=topic, recorded_at=recorded_at,
                           occurred_at=event.timestamp, actor=event.actor,
                           payload=redact(event.model_dump(mode="json", exclude=_EVENT_POSITION))))
    more = len(rows) > page.limit
    return ok(EventPage(items=items, next_after_version=items[-1].version if more else None))


# --- scheduled scans ---------------------------------------------------------------------------

SCHEDULE_PATH = "/v1/schedules/{schedule_id}"


async def _schedule(request: web.Request, operator: Operator, schedule_id: UUID) -> Schedule:
    row = await _services(request).schedules.get(schedule_id, organization_id=operator.organization_id)
    return Schedule(**row)


@routes.route("POST", "/v1/schedules", summary="Create a scheduled scan (an organisation key: its own)",
              auth="operator", request=CreateSchedule, response=Schedule, statuses=(201,), tags=TAGS,
              links=_links("schedule_id", "get_schedule_get", "pause_schedule_post", "resume_schedule_post",
                           "run_schedule_now_post", "delete_schedule_delete"))
async def create_schedule(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    body = await read_json(request, CreateSchedule)
    org_id = body.organization_id or operator.organization_id
    if org_id is None:
        raise InvalidRequest("organization_id is required with an administrator key")
    _see_organization(operator, org_id)
    profile = [ProfileStep(task_type=step.task_type, required_capabilities=tuple(step.required_capabilities),
                           execution_timeout_seconds=step.execution_timeout_seconds,
                           max_attempts=step.max_attempts, priority=step.priority,
                           stop_on_failure=step.stop_on_failure, lease_seconds=step.lease_seconds)
               for step in body.profile]
    schedule_id = await _services(request).schedules.create(
        org_id, name=body.name, targets=body.targets, profile=profile, cron=body.cron,
        interval_seconds=body.interval_seconds, timezone=body.timezone, misfire_policy=body.misfire_policy,
        actor=operator.actor)
    return ok(await _schedule(request, operator, schedule_id), status=201)


@routes.route("GET", "/v1/schedules", summary="The scheduled scans the key can see", auth="operator",
              response=SchedulePage, tags=TAGS)
async def list_schedules(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    rows = await _services(request).schedules.list(organization_id=operator.organization_id)
    return ok(SchedulePage(items=[Schedule(**row) for row in rows]))


@routes.route("GET", SCHEDULE_PATH, summary="Read a scheduled scan", auth="operator", response=Schedule,
              tags=TAGS)
async def get_schedule(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await _schedule(request, operator, _path_id(request, "schedule_id", "schedule")))


@routes.route("DELETE", SCHEDULE_PATH, summary="Delete a scheduled scan (its scans are kept)",
              auth="operator", response=ScheduleDeletion, tags=TAGS)
async def delete_schedule(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    schedule_id = _path_id(request, "schedule_id", "schedule")
    await _services(request).schedules.delete(schedule_id, organization_id=operator.organization_id,
                                              actor=operator.actor)
    return ok(ScheduleDeletion(schedule_id=schedule_id))


async def _set_schedule_enabled(request: web.Request, enabled: bool) -> web.StreamResponse:
    operator = await operator_identity(request)
    schedule_id = _path_id(request, "schedule_id", "schedule")
    schedules = _services(request).schedules
    if enabled:
        await schedules.resume(schedule_id, organization_id=operator.organization_id, actor=operator.actor)
    else:
        await schedules.pause(schedule_id, organization_id=operator.organization_id, actor=operator.actor)
    return ok(await _schedule(request, operator, schedule_id))


@routes.route("POST", SCHEDULE_PATH + "/pause", summary="Pause a scheduled scan", auth="operator",
              response=Schedule, tags=TAGS)
async def pause_schedule(request: web.Request) -> web.StreamResponse:
    return await _set_schedule_enabled(request, False)


@routes.route("POST", SCHEDULE_PATH + "/resume", summary="Resume a scheduled scan (missed slots are not run)",
              auth="operator", response=Schedule, tags=TAGS)
async def resume_schedule(request: web.Request) -> web.StreamResponse:
    return await _set_schedule_enabled(request, True)


@routes.route("POST", SCHEDULE_PATH + "/run-now", summary="Start one scan of the schedule now",
              auth="operator", response=ScheduleRun, statuses=(201,), tags=TAGS)
async def run_schedule_now(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    schedule_id = _path_id(request, "schedule_id", "schedule")
    scan_id = await _services(request).schedules.run_now(schedule_id, organization_id=operator.organization_id,
                                                         actor=operator.actor)
    return ok(ScheduleRun(schedule_id=schedule_id, scan_id=scan_id), status=201)


# --- stored profiles and execution modes ------------------------------------------------------
#
# A stored profile is read by the organisation that owns it and, for a global one, by every
# organisation; it is changed by its owner (a global one: administrators). The organisation's
# gateway_execution flag is an administrator's switch; precedence: domain/profiles.py.

PROFILE_PATH = "/v1/profiles/{profile_id}"


def _steps(steps: Sequence[ProfileStepBody]) -> tuple[ProfileStep, ...]:
    return tuple(ProfileStep(task_type=step.task_type, required_capabilities=tuple(step.required_capabilities),
                             execution_timeout_seconds=step.execution_timeout_seconds,
                             max_attempts=step.max_attempts, priority=step.priority,
                             stop_on_failure=step.stop_on_failure, lease_seconds=step.lease_seconds)
                 for step in steps)


async def _profile(request: web.Request, operator: Operator, profile_id: UUID) -> StoredProfile:
    row = await _services(request).profiles.get(profile_id, visible_to=operator.organization_id)
    return StoredProfile.of(row)


async def _changeable_profile(request: web.Request) -> tuple[Operator, UUID]:
    """The path's profile, visible to the key (404) and changeable by it (403: global profiles)."""
    operator = await operator_identity(request)
    profile_id = _path_id(request, "profile_id", "profile")
    profile = await _profile(request, operator, profile_id)
    if profile.organization_id is None:
        operator.require_admin()
    return operator, profile_id


@routes.route("POST", "/v1/profiles", summary="Store a named profile (an organisation key: its own)",
              auth="operator", request=CreateProfile, response=StoredProfile, statuses=(201,), tags=TAGS)
async def create_profile(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    body = await read_json(request, CreateProfile)
    owner: UUID | None = None
    if body.scope == "global":
        if body.organization_id is not None:
            raise InvalidRequest("a global profile has no organization_id")
        operator.require_admin()
    else:
        owner = body.organization_id or operator.organization_id
        if owner is None:
            raise InvalidRequest("organization_id is required with an administrator key (or scope: global)")
        _see_organization(operator, owner)
    profile_id = await _services(request).profiles.create(
        owner, name=body.name, steps=_steps(body.steps), gateway_execution=body.gateway_execution,
        actor=operator.actor)
    return ok(await _profile(request, operator, profile_id), status=201)


@routes.route("GET", "/v1/profiles", summary="The stored profiles the key can see (its own and the global ones)",
              auth="operator", response=StoredProfilePage, tags=TAGS)
async def list_profiles(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    rows = await _services(request).profiles.list(visible_to=operator.organization_id)
    return ok(StoredProfilePage(items=[StoredProfile.of(row) for row in rows]))


@routes.route("GET", PROFILE_PATH, summary="Read a stored profile", auth="operator", response=StoredProfile,
              tags=TAGS)
async def get_profile(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await _profile(request, operator, _path_id(request, "profile_id", "profile")))


@routes.route("PUT", PROFILE_PATH,
              summary="Replace a stored profile's steps (scans already created keep theirs)", auth="operator",
              request=ReplaceProfile, response=StoredProfile, tags=TAGS)
async def replace_profile(request: web.Request) -> web.StreamResponse:
    operator, profile_id = await _changeable_profile(request)
    body = await read_json(request, ReplaceProfile)
    await _services(request).profiles.replace(profile_id, _steps(body.steps), owner=operator.organization_id,
                                              actor=operator.actor)
    return ok(await _profile(request, operator, profile_id))


@routes.route("PUT", PROFILE_PATH + "/gateway-execution",
              summary="Let the profile's new scans be Gateway-executed, or keep them legacy-executed",
              auth="operator", request=GatewayExecution, response=StoredProfile, tags=TAGS)
async def set_profile_gateway_execution(request: web.Request) -> web.StreamResponse:
    operator, profile_id = await _changeable_profile(request)
    body = await read_json(request, GatewayExecution)
    await _services(request).profiles.set_gateway_execution(profile_id, body.enabled, owner=operator.organization_id,
                                                            actor=operator.actor)
    return ok(await _profile(request, operator, profile_id))


@routes.route("DELETE", PROFILE_PATH, summary="Delete a stored profile (its scans keep their steps)",
              auth="operator", response=ProfileDeletion, tags=TAGS)
async def delete_profile(request: web.Request) -> web.StreamResponse:
    operator, profile_id = await _changeable_profile(request)
    await _services(request).profiles.delete(profile_id, owner=operator.organization_id, actor=operator.actor)
    return ok(ProfileDeletion(profile_id=profile_id))


@routes.route("PUT", "/v1/organizations/{organization_id}/gateway-execution",
              summary="Whether the organisation's new scans are Gateway-executed; off is the rollback switch "
                      "(running scans go on) (administrator)",
              auth="operator", request=GatewayExecution, response=Organization, tags=TAGS)
async def set_organization_gateway_execution(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    org_id = _path_id(request, "organization_id", "organisation")
    await _organization(request, operator, org_id)
    operator.require_admin()
    body = await read_json(request, GatewayExecution)
    await _services(request).registry.set_gateway_execution(org_id, body.enabled, actor=operator.actor)
    return ok(await _organization(request, operator, org_id))


@routes.route("GET", "/v1/organizations/{organization_id}/fair-share",
              summary="The organisation's fair-share weight, cap and counters (an organisation key: its own)",
              auth="operator", response=FairShare, tags=TAGS)
async def get_fair_share(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    org_id = _path_id(request, "organization_id", "organisation")
    _see_organization(operator, org_id)
    state = await _services(request).registry.fair_share(org_id)
    if state is None:
        raise NotFound("no such organisation", organization_id=str(org_id))
    return ok(FairShare.of(state))


@routes.route("PUT", "/v1/organizations/{organization_id}/fair-share",
              summary="Set the organisation's fair-share weight and its cap of live attempts across the fleet "
                      "(administrator)",
              auth="operator", request=SetFairShare, response=FairShare, tags=TAGS)
async def set_fair_share(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    org_id = _path_id(request, "organization_id", "organisation")
    await _organization(request, operator, org_id)
    operator.require_admin()
    body = await read_json(request, SetFairShare)
    state = await _services(request).registry.set_fair_share(
        org_id, weight=body.weight, max_live_attempts=body.max_live_attempts, actor=operator.actor)
    return ok(FairShare.of(state))


@routes.route("POST", "/v1/scans/{scan_id}/legacy-status",
              summary="Record the legacy side's progress on a legacy-executed scan (running, then its outcome)",
              auth="operator", request=LegacyStatus, response=Scan, tags=TAGS)
async def record_legacy_status(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    scan_id = _path_id(request, "scan_id", "scan")
    await _scan(request, operator, scan_id)
    body = await read_json(request, LegacyStatus)
    await _services(request).legacy.record_status(scan_id, body.status, actor=operator.actor)
    return ok(await _scan(request, operator, scan_id))
