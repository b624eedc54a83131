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
``finish_active=true`` lets them finish. Disabling a worker goes through the same path but ends
its active attempts at once (a disabled worker can neither hear nor acknowledge a cancel): each
task goes back to ``retry_wait``, available to another worker now.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from aiohttp import web
from pydantic_core import to_jsonable_python

from leasehold.domain import targets as target_rules
from leasehold.domain.errors import Conflict, Forbidden, InvalidRequest, NotFound
from leasehold.domain.events import ProfileStep
from leasehold.gateway.api.http import BadRequest, RouteTable, ok, read_json, read_query
from leasehold.gateway.api.operator_models import (
    MAX_DETAIL_JOBS,
    NO_TASK_TYPES,
    AddAssignment,
    ApiKeyCreated,
    ApiKeyPage,
    ApiKeysQuery,
    ApiKeyView,
    Asset,
    AssetList,
    AssignmentView,
    Attempt,
    CancelScan,
    CancelTask,
    Counts,
    CountsQuery,
    CreateAnyApiKey,
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
    ListQuery,
    LiveLease,
    Organization,
    OrganizationCounts,
    OrganizationPage,
    PageQuery,
    ProfileDeletion,
    ProfileStepBody,
    QueueCounts,
    RegisterWorker,
    RemoveAssignmentQuery,
    ReplaceProfile,
    RetryTask,
    Revocation,
    RevokeAssignment,
    RevokeWorker,
    RotateApiKey,
    Scan,
    ScanCancellation,
    ScanDetail,
    ScanListQuery,
    ScanPage,
    Schedule,
    ScheduleDeletion,
    SchedulePage,
    ScheduleRun,
    Seal,
    SetFairShare,
    SetTargetPolicy,
    StoredProfile,
    StoredProfilePage,
    TargetPolicy,
    Task,
    TaskListQuery,
    TaskPage,
    TaskSummary,
    Threat,
    ThreatList,
    UpdateWorker,
    Worker,
    WorkerPage,
    WorkerPresence,
    WorkersQuery,
    clip,
    job,
    live_lease,
    redact,
    task_summary,
)
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.commands.lifecycle import TaskSpec
from leasehold.gateway.commands.registry import IssuedKey
from leasehold.gateway.identity import Operator
from leasehold.gateway.keys import READ_DATABASE, SEALER, SERVICES, SETTINGS
from leasehold.gateway.presence import latest, liveness
from leasehold.gateway.services import Services
from leasehold.gateway.settings import GatewaySettings
from leasehold.persistence.event_log import decode_event
from leasehold.persistence.task_rows import task_from_row
from leasehold.persistence.transaction import Database, Reader

log = logging.getLogger("leasehold.gateway")
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


#: Methods whose reads may be served by the read database (a replica when one is configured).
_LAG_TOLERANT = frozenset({"GET", "HEAD"})


def reads(request: web.Request) -> Database:
    """Where this request's reads go (the console's pages' too): a GET's to the read database
    (``read_database_url``: a replica, which may lag the primary by its replay delay); a request
    that writes reads back from the primary, so its answer shows its own change."""
    if request.method in _LAG_TOLERANT:
        return request.app[READ_DATABASE]
    return _services(request).db


def _path_id(request: web.Request, name: str, what: str) -> UUID:
    raw = request.match_info[name]
    try:
        return UUID(raw)
    except ValueError as exc:  # the 404 of an unknown id, in the same shape
        raise NotFound(f"no such {what}", **{name: raw}) from exc


def _see_organization(operator: Operator, organization_id: UUID) -> None:
    if not operator.can_see(organization_id):
        raise NotFound("no such organisation", organization_id=str(organization_id))


async def _organization(request: web.Request, operator: Operator, organization_id: UUID) -> Organization:
    _see_organization(operator, organization_id)
    async with reads(request).read() as reader:
        row = await reader.one("organization_get", {"organization_id": organization_id})
    if row is None:
        raise NotFound("no such organisation", organization_id=str(organization_id))
    return Organization.of(row)


async def _seen_organization(request: web.Request) -> tuple[Operator, UUID]:
    """The caller and the organisation of the path, which the caller may see (404 otherwise)."""
    operator = await operator_identity(request)
    org_id = _path_id(request, "organization_id", "organisation")
    await _organization(request, operator, org_id)
    return operator, org_id


def _presence(row: Sequence[Any], operator: Operator, settings: GatewaySettings) -> WorkerPresence:
    """A ``workers_presence`` row, judged; an organisation key is not shown the renewals and writes,
    which may be for other organisations' tasks (the liveness judged from them, it is)."""
    _, poll, renew, write, now = row
    state = liveness(latest(poll, renew, write), now, live=timedelta(seconds=settings.worker_live_seconds),
                     idle=timedelta(seconds=settings.worker_idle_seconds))
    if not operator.is_admin:
        renew = write = None
    return WorkerPresence(liveness=state, last_poll_at=poll, last_renew_at=renew, last_write_at=write)


async def _workers(reader: Reader, operator: Operator, rows: list[Any], settings: GatewaySettings, *,
                   with_leases: bool = True) -> list[Worker]:
    """The workers of ``rows`` with their assignments, last seen, presence and (``with_leases``)
    live leases."""
    params = {"worker_ids": [r[0] for r in rows], "organization_id": operator.organization_id, "now": None}
    assignments: dict[UUID, list[AssignmentView]] = {}
    for a in await reader.all("assignments_of_workers", params):
        assignments.setdefault(a[0], []).append(AssignmentView.of(a))
    seen: dict[UUID, datetime | None] = {r[0]: r[1] for r in await reader.all("workers_last_seen", params)}
    presence = {r[0]: _presence(r, operator, settings) for r in await reader.all("workers_presence", params)}
    leases: dict[UUID, list[LiveLease]] = {}
    for lease in await reader.all("workers_live_leases", params) if with_leases else []:
        leases.setdefault(lease[0], []).append(live_lease(lease))
    return [Worker.of(r, assignments.get(r[0], []), last_seen_at=seen.get(r[0]), live_leases=leases.get(r[0], []),
                      presence=presence.get(r[0])) for r in rows]


async def read_worker(request: web.Request, operator: Operator, worker_id: UUID, *,
                      with_leases: bool = True) -> Worker:
    """The worker as ``operator`` may see it; 404 when it does not exist or is not theirs."""
    async with reads(request).read() as reader:
        row = await reader.one("worker_get", {"worker_id": worker_id, "organization_id": operator.organization_id})
        if row is None:
            raise NotFound("no such worker", worker_id=str(worker_id))
        (worker,) = await _workers(reader, operator, [row], request.app[SETTINGS], with_leases=with_leases)
    return worker


async def read_scan(request: web.Request, operator: Operator, scan_id: UUID) -> Scan:
    async with reads(request).read() as reader:
        row = await reader.one("scan_get", {"scan_id": scan_id})
    if row is None or not operator.can_see(row[1]):
        raise NotFound("no such scan", scan_id=str(scan_id))
    return Scan.of(row)


async def see_task(request: web.Request, operator: Operator, task_id: UUID) -> None:
    async with reads(request).read() as reader:
        row = await reader.one("task_organization", {"task_id": task_id})
    if row is None or not operator.can_see(row[0]):
        raise NotFound("no such task", task_id=str(task_id))


async def read_task(request: web.Request, operator: Operator, task_id: UUID) -> Task:
    """The task with every attempt, read in one snapshot."""
    async with reads(request).snapshot() as reader:
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
    async with reads(request).read() as reader:
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
    operator, org_id = await _seen_organization(request)
    operator.require_admin()
    body = await read_json(request, CreateApiKey)
    issued = await _services(request).registry.create_api_key(organization_id=org_id, name=body.name,
                                                              expires_at=body.expires_at)
    return ok(_created(issued), status=201)


# --- API keys (administrator) -------------------------------------------------------------------

KEY_PATH = "/v1/api-keys/{key_id}"


def _created(issued: IssuedKey, replaces: UUID | None = None) -> ApiKeyCreated:
    return ApiKeyCreated(id=issued.id, name=issued.name, organization_id=issued.organization_id, key=issued.key,
                         expires_at=issued.expires_at, replaces=replaces)


async def _admin(request: web.Request) -> Operator:
    operator = await operator_identity(request)
    operator.require_admin()
    return operator


@routes.route("GET", "/v1/api-keys", summary="List API keys, never the keys themselves (administrator)",
              auth="operator", query=ApiKeysQuery, response=ApiKeyPage, tags=TAGS)
async def list_api_keys(request: web.Request) -> web.StreamResponse:
    await _admin(request)
    page = read_query(request, ApiKeysQuery)
    items = [ApiKeyView.of(r) for r in await _services(request).registry.api_keys(
        organization_id=page.organization_id, after=page.after, limit=page.limit + 1)]
    return ok(ApiKeyPage(items=items[:page.limit], next_after=_next_after(items, page.limit)))


@routes.route("POST", "/v1/api-keys",
              summary="Create an API key, of an organisation or an administrator key, optionally expiring "
                      "(administrator; the key is shown once)",
              auth="operator", request=CreateAnyApiKey, response=ApiKeyCreated, statuses=(201,), tags=TAGS,
              links=_links("key_id", "get_api_key_get", "revoke_api_key_post", "rotate_api_key_post"))
async def create_api_key(request: web.Request) -> web.StreamResponse:
    await _admin(request)
    body = await read_json(request, CreateAnyApiKey)
    issued = await _services(request).registry.create_api_key(organization_id=body.organization_id, name=body.name,
                                                              expires_at=body.expires_at)
    return ok(_created(issued), status=201)


@routes.route("GET", KEY_PATH, summary="Read an API key's record (administrator)", auth="operator",
              response=ApiKeyView, tags=TAGS)
async def get_api_key(request: web.Request) -> web.StreamResponse:
    await _admin(request)
    key_id = _path_id(request, "key_id", "API key")
    return ok(ApiKeyView.of(await _services(request).registry.api_key_row(key_id)))


@routes.route("POST", KEY_PATH + "/revoke",
              summary="Revoke an API key: its next request answers 401 (administrator; idempotent)",
              auth="operator", response=ApiKeyView, tags=TAGS)
async def revoke_api_key(request: web.Request) -> web.StreamResponse:
    await _admin(request)
    key_id = _path_id(request, "key_id", "API key")
    registry = _services(request).registry
    await registry.revoke_api_key(key_id)
    return ok(ApiKeyView.of(await registry.api_key_row(key_id)))


@routes.route("POST", KEY_PATH + "/rotate",
              summary="Rotate an API key: a new key with the same name and scope, the old one revoked in the "
                      "same transaction (administrator; the new key is shown once; 409 if already revoked)",
              auth="operator", request=RotateApiKey, response=ApiKeyCreated, statuses=(201,), tags=TAGS)
async def rotate_api_key(request: web.Request) -> web.StreamResponse:
    await _admin(request)
    key_id = _path_id(request, "key_id", "API key")
    body = await read_json(request, RotateApiKey)
    issued = await _services(request).registry.rotate_api_key(key_id, expires_at=body.expires_at)
    return ok(_created(issued, replaces=key_id), status=201)


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


# --- assignments ------------------------------------------------------------------------------


@routes.route("POST", WORKER_PATH + "/assignments",
              summary="Assign a worker to an organisation (administrator; repeating it is a no-op)",
              auth="operator", request=AddAssignment, response=Worker, tags=TAGS)
async def add_assignment(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    worker_id = _path_id(request, "worker_id", "worker")
    await read_worker(request, operator, worker_id)
    body = await read_json(request, AddAssignment)
    _see_organization(operator, body.organization_id)
    operator.require_admin()
    await _services(request).registry.assign_worker(worker_id, body.organization_id, actor=operator.actor)
    return ok(await read_worker(request, operator, worker_id))


async def _assignment_ids(request: web.Request) -> tuple[Operator, UUID, UUID]:
    operator = await operator_identity(request)
    worker_id = _path_id(request, "worker_id", "worker")
    org_id = _path_id(request, "organization_id", "organisation")
    await see_assignment(request, operator, worker_id, org_id)
    return operator, worker_id, org_id


async def see_assignment(request: web.Request, operator: Operator, worker_id: UUID, org_id: UUID) -> None:
    """The worker and the organisation are visible (404), and the caller is an administrator (403)."""
    await read_worker(request, operator, worker_id)
    _see_organization(operator, org_id)
    operator.require_admin()


@routes.route("DELETE", ASSIGNMENT_PATH,
              summary="Remove an assignment: new leases stop; active tasks are cancelled unless "
                      "finish_active=true (administrator)",
              auth="operator", query=RemoveAssignmentQuery, response=Revocation, tags=TAGS)
async def remove_assignment(request: web.Request) -> web.StreamResponse:
    operator, worker_id, org_id = await _assignment_ids(request)
    options = read_query(request, RemoveAssignmentQuery)
    return ok(await unassign_worker(request, operator, worker_id, org_id, finish_active=options.finish_active))


async def unassign_worker(request: web.Request, operator: Operator, worker_id: UUID, org_id: UUID, *,
                          finish_active: bool) -> Revocation:
    """Remove the worker's assignment to the organisation: new leases stop; its active tasks of
    that organisation are cancelled unless ``finish_active`` (visibility and 403 as
    :func:`see_assignment`)."""
    await see_assignment(request, operator, worker_id, org_id)
    await _services(request).registry.end_assignment(worker_id, org_id, revoke=False, actor=operator.actor)
    cancelled: list[UUID] = []
    if not finish_active:
        cancelled = await _services(request).lifecycle.cancel_worker_attempts(
            worker_id, organization_id=org_id, reason=f"worker removed from organisation {org_id}",
            actor=operator.actor)
    return Revocation(worker=await read_worker(request, operator, worker_id), cancelled_task_ids=cancelled)


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
    return ok(Revocation(worker=await read_worker(request, operator, worker_id), cancelled_task_ids=cancelled))


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
    return ok(await read_scan(request, operator, scan_id), status=201)


@routes.route("GET", "/v1/scans/{scan_id}", summary="Read a scan", auth="operator", response=Scan, tags=TAGS)
async def get_scan(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await read_scan(request, operator, _path_id(request, "scan_id", "scan")))


@routes.route("POST", "/v1/scans/{scan_id}/tasks", summary="Queue a job on the scan and create its task",
              auth="operator", request=CreateTask, response=Task, statuses=(201,), tags=TAGS,
              links=_links("task_id", "get_task_get", "task_events_get", "cancel_task_post"))
async def create_task(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    scan_id = _path_id(request, "scan_id", "scan")
    await read_scan(request, operator, scan_id)
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
    for originator_id, version, topic, state, recorded_at in rows[:page.limit]:
        event = decode_event(originator_id, version, topic, bytes(state))
        # Clipped before it becomes JSON: a value stored before the input limits may nest deeper
        # than an answer can encode.
        payload, clipped = clip(event.model_dump(exclude=_EVENT_POSITION))
        items.append(Event(version=version, type=type(event).__name__, topic=topic, recorded_at=recorded_at,
                           occurred_at=event.timestamp, actor=event.actor,
                           payload=to_jsonable_python(redact(payload)), payload_clipped=clipped))
    more = len(rows) > page.limit
    return EventPage(items=items, next_after_version=items[-1].version if more else None)


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
    operator, org_id = await _seen_organization(request)
    operator.require_admin()
    body = await read_json(request, GatewayExecution)
    await _services(request).registry.set_gateway_execution(org_id, body.enabled, actor=operator.actor)
    return ok(await _organization(request, operator, org_id))


def _target_policy(org_id: UUID, policy: target_rules.TargetPolicy) -> TargetPolicy:
    return TargetPolicy(organization_id=org_id, allow=policy.allow, deny=policy.deny,
                        denied_by_default=[*map(str, target_rules.DEFAULT_DENIED_NETWORKS),
                                           *target_rules.DEFAULT_DENIED_DOMAINS])


@routes.route("GET", "/v1/organizations/{organization_id}/target-policy",
              summary="The organisation's target policy: which scan targets it may aim workers at",
              auth="operator", response=TargetPolicy, tags=TAGS)
async def get_target_policy(request: web.Request) -> web.StreamResponse:
    operator, org_id = await _seen_organization(request)
    return ok(_target_policy(org_id, await _services(request).registry.target_policy(org_id)))


@routes.route("PUT", "/v1/organizations/{organization_id}/target-policy",
              summary="Replace the organisation's target policy (opening a default-denied network: administrator)",
              auth="operator", request=SetTargetPolicy, response=TargetPolicy, statuses=(200, 403), tags=TAGS)
async def set_target_policy(request: web.Request) -> web.StreamResponse:
    operator, org_id = await _seen_organization(request)
    body = await read_json(request, SetTargetPolicy)
    policy = target_rules.parse_policy(body.allow, body.deny)
    if policy.opens_default_denied and operator.organization_id is not None:
        raise Forbidden("only an administrator key may open default-denied networks "
                        f"({', '.join(policy.opens_default_denied)})")
    await _services(request).registry.set_target_policy(org_id, policy, actor=operator.actor)
    return ok(_target_policy(org_id, policy))


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
    operator, org_id = await _seen_organization(request)
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
    await read_scan(request, operator, scan_id)
    body = await read_json(request, LegacyStatus)
    await _services(request).legacy.record_status(scan_id, body.status, actor=operator.actor)
    return ok(await read_scan(request, operator, scan_id))


# --- finding work: lists, scan detail, counts, retry -------------------------------------------
#
# Lists are newest first, (created_at, id) descending, a page at a time: ``next_cursor`` names the
# last item of the page (opaque to clients: base64url of its created_at and id), and the next page
# starts strictly after it, so rows created meanwhile never shift a page. Filters are exact
# matches; an organisation key lists only its own organisation, and naming another answers 404.


def encode_cursor(created_at: datetime, item_id: UUID) -> str:
    raw = f"{created_at.isoformat()}|{item_id}".encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    """The position a ``next_cursor`` names; 400 for anything this API did not give out."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, item_id = raw.partition("|")
        created_at = datetime.fromisoformat(at)
        if created_at.tzinfo is None:
            raise ValueError("naive time")
        return created_at, UUID(item_id)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise BadRequest("the cursor is not one this API gave out (pass a page's next_cursor unchanged)",
                         ) from exc


def scope(operator: Operator, requested: UUID | None) -> UUID | None:
    """The organisation a list or count covers: the one asked for (404 when the key cannot see
    it), else the key's own (None for an administrator: all of them)."""
    if requested is not None:
        _see_organization(operator, requested)
        return requested
    return operator.organization_id


def _page_params(operator: Operator, query: ListQuery) -> dict[str, Any]:
    before_at, before_id = decode_cursor(query.cursor) if query.cursor is not None else (None, None)
    return {"organization_id": scope(operator, query.organization_id), "created_from": query.created_from,
            "created_to": query.created_to, "before_at": before_at, "before_id": before_id,
            "limit": query.limit + 1}


def _next_cursor(items: Sequence[Scan | TaskSummary], limit: int) -> str | None:
    return encode_cursor(items[limit - 1].created_at, items[limit - 1].id) if len(items) > limit else None


@routes.route("GET", "/v1/scans", summary="List scans, newest first (filters: status, organisation, creation time)",
              auth="operator", query=ScanListQuery, response=ScanPage, statuses=(400,), tags=TAGS)
async def list_scans(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await scans_page(request, operator, read_query(request, ScanListQuery)))


async def scans_page(request: web.Request, operator: Operator, query: ScanListQuery) -> ScanPage:
    """One page of the scans ``operator`` may see (404 naming an organisation it cannot)."""
    params = {**_page_params(operator, query), "status": query.status}
    async with reads(request).snapshot() as reader:
        await reader.one("custom_plans", {})
        items = [Scan.of(r) for r in await reader.all("scans_page", params)]
    return ScanPage(items=items[:query.limit], next_cursor=_next_cursor(items, query.limit))


@routes.route("GET", "/v1/scans/{scan_id}/detail",
              summary="A scan with its jobs (in position order) and each job's task", auth="operator",
              response=ScanDetail, tags=TAGS)
async def get_scan_detail(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await scan_detail(request, operator, _path_id(request, "scan_id", "scan")))


async def scan_detail(request: web.Request, operator: Operator, scan_id: UUID) -> ScanDetail:
    """The scan with its jobs and their tasks, read in one snapshot (404 when not visible)."""
    async with reads(request).snapshot() as reader:
        row = await reader.one("scan_get", {"scan_id": scan_id})
        if row is None or not operator.can_see(row[1]):
            raise NotFound("no such scan", scan_id=str(scan_id))
        jobs = [job(r) for r in await reader.all("scan_jobs_with_tasks",
                                                    {"scan_id": scan_id, "limit": MAX_DETAIL_JOBS})]
        (_, job_count, *_) = await reader.one("scan_jobs_summary", {"scan_id": scan_id}) or (None, 0)
    return ScanDetail(scan=Scan.of(row), jobs=jobs, job_count=job_count)


@routes.route("GET", "/v1/tasks",
              summary="List tasks, newest first (filters: state, type, organisation, scan, worker, creation time)",
              auth="operator", query=TaskListQuery, response=TaskPage, statuses=(400,), tags=TAGS)
async def list_tasks(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    query = read_query(request, TaskListQuery)
    params = {**_page_params(operator, query), "state": query.state, "task_type": query.task_type,
              "scan_id": query.scan_id, "worker_id": query.worker_id}
    async with reads(request).snapshot() as reader:
        await reader.one("custom_plans", {})
        items = [task_summary(r) for r in await reader.all("tasks_page", params)]
    return ok(TaskPage(items=items[:query.limit], next_cursor=_next_cursor(items, query.limit)))


TASK_STATES = ("pending", "leased", "running", "retry_wait", "completed", "failed_terminal", "cancelling",
               "cancelled")
SCAN_STATUSES = ("pending", "running", "success", "failed", "cancelled")


@routes.route("GET", "/v1/counts",
              summary="Tasks by state, scans by status, and the queue (depth, oldest waiting) per organisation",
              auth="operator", query=CountsQuery, response=Counts, tags=TAGS)
async def get_counts(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await counts(request, operator, read_query(request, CountsQuery).organization_id))


async def counts(request: web.Request, operator: Operator, organization_id: UUID | None) -> Counts:
    """Tasks by state, scans by status and the queue per organisation ``operator`` may see."""
    params = {"organization_id": scope(operator, organization_id), "now": None}
    async with reads(request).snapshot() as reader:
        await reader.one("custom_plans", {})
        tasks = await reader.all("task_counts", params)
        scans = await reader.all("scan_counts", params)
        queues = await reader.all("task_queues", params)
        (measured_at,) = await reader.one("snapshot_now", {"now": None}) or (None,)
    orgs: dict[UUID, dict[str, Any]] = {}

    def entry(org: UUID) -> dict[str, Any]:
        return orgs.setdefault(org, {"tasks": dict.fromkeys(TASK_STATES, 0), "scans": dict.fromkeys(SCAN_STATUSES, 0),
                                     "queue": QueueCounts(depth=0, ready=0, oldest_ready_since=None,
                                                          oldest_ready_age_seconds=None)})
    if params["organization_id"] is not None:
        entry(params["organization_id"])
    for org, state, count in tasks:
        entry(org)["tasks"][state] = count
    for org, status, count in scans:
        entry(org)["scans"][status] = count
    for org, depth, ready, oldest, now in queues:
        entry(org)["queue"] = QueueCounts(
            depth=depth, ready=ready, oldest_ready_since=oldest,
            oldest_ready_age_seconds=round((now - oldest).total_seconds(), 3) if oldest is not None else None)
    return Counts(measured_at=measured_at, organizations=[
        OrganizationCounts(organization_id=org, tasks_by_state=e["tasks"], scans_by_status=e["scans"],
                           queue=e["queue"]) for org, e in sorted(orgs.items(), key=lambda kv: str(kv[0]))])


@routes.route("POST", TASK_PATH + "/retry",
              summary="Retry a failed_terminal task: back to pending with fresh attempts (recorded as TaskRetried)",
              auth="operator", request=RetryTask, response=Task, tags=TAGS)
async def retry_task(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    task_id = _path_id(request, "task_id", "task")
    await see_task(request, operator, task_id)
    body = await read_json(request, RetryTask)
    await retry(request, operator, task_id, body)
    return ok(await read_task(request, operator, task_id))


async def retry(request: web.Request, operator: Operator, task_id: UUID, body: RetryTask) -> None:
    """Retry a failed_terminal task (the caller checked visibility; 409 in any other state, or
    when its scan was cancelled)."""
    await _services(request).lifecycle.retry(task_id, reason=body.reason, attempts=body.attempts,
                                             actor=operator.actor)


# --- seals ------------------------------------------------------------------------------------


@routes.route("POST", "/v1/seals",
              summary="Write a signed seal now and publish it to the digest sink (administrator; 409 when "
                      "no seal key is configured)",
              auth="operator", response=Seal, statuses=(201,), tags=TAGS)
async def seal_now(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    operator.require_admin()
    sealer = request.app.get(SEALER)
    if sealer is None:
        raise Conflict("sealing is not configured (set seal_key_file and digest_dir)")
    async with _services(request).db.connection() as conn:
        record = await sealer.seal(conn)
    return ok(Seal.model_validate(record), status=201)
