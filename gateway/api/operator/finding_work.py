"""The operator API: finding work: lists, scan detail, counts, retry."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from aiohttp import web

from leasehold.domain.errors import NotFound
from leasehold.gateway.api.http import BadRequest, RouteTable, ok, read_json, read_query
from leasehold.gateway.api.operator.common import (
    TAGS,
    TASK_PATH,
    _path_id,
    _see_organization,
    _services,
    read_task,
    reads,
    see_task,
)
from leasehold.gateway.api.operator_models import (
    MAX_DETAIL_JOBS,
    Counts,
    CountsQuery,
    ListQuery,
    OrganizationCounts,
    QueueCounts,
    RetryTask,
    Scan,
    ScanDetail,
    ScanListQuery,
    ScanPage,
    Task,
    TaskListQuery,
    TaskPage,
    TaskSummary,
    job,
    task_summary,
)
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.identity import Operator

routes = RouteTable()


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
        if row is None or not operator.can_see(row.organization_id):
            raise NotFound("no such scan", scan_id=str(scan_id))
        jobs = [job(r) for r in await reader.all("scan_jobs_with_tasks",
                                                    {"scan_id": scan_id, "limit": MAX_DETAIL_JOBS})]
        job_count = (await reader.value("scan_jobs_summary", {"scan_id": scan_id})).jobs
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
        # Leased and running tasks are found through their live attempts (no task index names state).
        statement = "tasks_page_live" if query.state in LIVE_TASK_STATES else "tasks_page"
        items = [task_summary(r) for r in await reader.all(statement, params)]
    return ok(TaskPage(items=items[:query.limit], next_cursor=_next_cursor(items, query.limit)))


#: The states a task is in only while its current attempt is live.
LIVE_TASK_STATES = ("leased", "running")
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
        measured_at = (await reader.value("snapshot_now", {"now": None})).now
    orgs: dict[UUID, dict[str, Any]] = {}

    def entry(org: UUID) -> dict[str, Any]:
        return orgs.setdefault(org, {"tasks": dict.fromkeys(TASK_STATES, 0), "scans": dict.fromkeys(SCAN_STATUSES, 0),
                                     "queue": QueueCounts(depth=0, ready=0, oldest_ready_since=None,
                                                          oldest_ready_age_seconds=None)})
    if params["organization_id"] is not None:
        entry(params["organization_id"])
    for t in tasks:
        entry(t.organization_id)["tasks"][t.state] = t.n
    for s in scans:
        entry(s.organization_id)["scans"][s.status] = s.count
    for q in queues:
        oldest = q.oldest_available_at
        entry(q.organization_id)["queue"] = QueueCounts(
            depth=q.queued, ready=q.available, oldest_ready_since=oldest,
            oldest_ready_age_seconds=round((q.now - oldest).total_seconds(), 3) if oldest is not None else None)
    return Counts(measured_at=measured_at, organizations=[
        OrganizationCounts(organization_id=org, tasks_by_state=orgs[org]["tasks"], scans_by_status=orgs[org]["scans"],
                           queue=orgs[org]["queue"]) for org in sorted(orgs, key=str)])


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


