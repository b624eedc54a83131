"""The operator API: reading (no transactions of their own that write; every read checks visibility)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from aiohttp import web

from leasehold.domain.errors import NotFound
from leasehold.gateway.api.operator_models import (
    AssignmentView,
    Attempt,
    LiveLease,
    Organization,
    Scan,
    Task,
    Worker,
    WorkerPresence,
    live_lease,
)
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.identity import Operator
from leasehold.gateway.keys import READ_DATABASE, SERVICES, SETTINGS
from leasehold.gateway.presence import latest, liveness
from leasehold.gateway.services import Services
from leasehold.gateway.settings import GatewaySettings
from leasehold.persistence.task_rows import task_from_row
from leasehold.persistence.transaction import Database, Reader

log = logging.getLogger("leasehold.gateway")
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


def _presence(row: Any, operator: Operator, settings: GatewaySettings) -> WorkerPresence:
    """A ``workers_presence`` row, judged; an organisation key is not shown the renewals and writes,
    which may be for other organisations' tasks (the liveness judged from them, it is)."""
    poll, renew, write, now = row.last_poll_at, row.last_renew_at, row.last_write_at, row.now
    state = liveness(latest(poll, renew, write), now, live=timedelta(seconds=settings.worker_live_seconds),
                     idle=timedelta(seconds=settings.worker_idle_seconds))
    if not operator.is_admin:
        renew = write = None
    return WorkerPresence(liveness=state, last_poll_at=poll, last_renew_at=renew, last_write_at=write)


async def _workers(reader: Reader, operator: Operator, rows: list[Any], settings: GatewaySettings, *,
                   with_leases: bool = True) -> list[Worker]:
    """The workers of ``rows`` with their assignments, last seen, presence and (``with_leases``)
    live leases."""
    params = {"worker_ids": [r.id for r in rows], "organization_id": operator.organization_id, "now": None}
    assignments: dict[UUID, list[AssignmentView]] = {}
    for a in await reader.all("assignments_of_workers", params):
        assignments.setdefault(a.worker_id, []).append(AssignmentView.of(a))
    seen: dict[UUID, datetime | None] = {r.id: r.last_seen_at for r in await reader.all("workers_last_seen", params)}
    presence = {r.id: _presence(r, operator, settings) for r in await reader.all("workers_presence", params)}
    leases: dict[UUID, list[LiveLease]] = {}
    for lease in await reader.all("workers_live_leases", params) if with_leases else []:
        leases.setdefault(lease.worker_id, []).append(live_lease(lease))
    return [Worker.of(r, assignments.get(r.id, []), last_seen_at=seen.get(r.id), live_leases=leases.get(r.id, []),
                      presence=presence.get(r.id)) for r in rows]


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
    if row is None or not operator.can_see(row.organization_id):
        raise NotFound("no such scan", scan_id=str(scan_id))
    return Scan.of(row)


async def see_task(request: web.Request, operator: Operator, task_id: UUID) -> None:
    async with reads(request).read() as reader:
        row = await reader.one("task_organization", {"task_id": task_id})
    if row is None or not operator.can_see(row.organization_id):
        raise NotFound("no such task", task_id=str(task_id))


async def read_task(request: web.Request, operator: Operator, task_id: UUID) -> Task:
    """The task with every attempt, read in one snapshot."""
    async with reads(request).snapshot() as reader:
        row = await reader.one("task_get", {"task_id": task_id})
        if row is None or not operator.can_see(row.organization_id):
            raise NotFound("no such task", task_id=str(task_id))
        task, _ = task_from_row(row)
        attempts = [Attempt.from_row(a) for a in await reader.all("attempts_of_task", {"task_id": task_id})]
    return Task.of(task, attempts)


def _next_after(items: list[Any], limit: int) -> UUID | None:
    return items[limit - 1].id if len(items) > limit else None


