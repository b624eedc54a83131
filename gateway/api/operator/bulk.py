"""The operator API: bulk operations — cancel or retry every task a filter selects, tracked.

``POST /v1/bulk-previews`` counts what a filter selects; ``POST /v1/bulk-operations``
starts the operation (202: it runs in the background, :mod:`gateway.commands.bulk`) and takes an
``Idempotency-Key``; ``GET`` reads its progress and each task's outcome; ``…/stop`` stops it. An
organisation key's operations are confined to its organisation; an administrator's filter must
name something (an organisation, a scan, a state, a type or a worker): "every task" is refused.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from uuid import UUID

from aiohttp import web
from pydantic import AwareDatetime, Field, StrictInt, field_validator

from leasehold.client.models import (
    BulkOperation,
    BulkOperationPage,
    BulkPreview,
    BulkTaskOutcome,
    BulkTaskOutcomePage,
)
from leasehold.domain.errors import InvalidRequest, NotFound
from leasehold.domain.events import TaskStateName
from leasehold.gateway.api.http import INTEGRAL, RouteTable, idempotency_key, ok, read_json, read_query
from leasehold.gateway.api.operator.common import TAGS, _path_id, _services, reads
from leasehold.gateway.api.operator.finding_work import scope
from leasehold.gateway.api.operator.scans import _idempotency
from leasehold.gateway.api.operator_models import RFC3339, Body, Label, Query, Reason
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.commands.bulk import TaskFilter
from leasehold.gateway.commands.idempotency import AlreadyCreated
from leasehold.gateway.identity import Operator

routes = RouteTable()
OPERATION_PATH = "/v1/bulk-operations/{operation_id}"


class BulkFilter(Body):
    """Which tasks, as ``GET /v1/tasks`` filters them (every field optional)."""

    organization_id: UUID | None = Field(None, description="an organisation key: its own (the default)")
    state: TaskStateName | None = None
    task_type: Label | None = None
    scan_id: UUID | None = None
    worker_id: UUID | None = Field(None, description="tasks whose current (latest) attempt is this worker's")
    created_from: AwareDatetime | None = Field(None, description="created at or after (RFC 3339, with an offset)")
    created_to: AwareDatetime | None = Field(None, description="created before (RFC 3339, with an offset)")

    @field_validator("created_from", "created_to", mode="before")
    @classmethod
    def _rfc3339(cls, value: Any) -> Any:
        """Text in RFC 3339 only (pydantic alone would also take a number of seconds since 1970)."""
        if value is not None and (not isinstance(value, str) or not RFC3339.match(value)):
            raise ValueError("expected an RFC 3339 date-time with an offset, e.g. 2026-01-31T12:00:00Z")
        return value


class PreviewBulkOperation(Body):
    action: Literal["cancel", "retry"]
    filter: BulkFilter = Field(default_factory=BulkFilter)


class StartBulkOperation(Body):
    action: Literal["cancel", "retry"] = Field(description=(
        "cancel: each task as POST /v1/tasks/{id}/cancel; retry: each failed_terminal task as POST …/retry"))
    filter: BulkFilter = Field(default_factory=BulkFilter)
    reason: Reason = "bulk operation by an operator"
    attempts: Annotated[StrictInt, Field(ge=1, le=100), INTEGRAL] | None = Field(
        None, description="retry only: fresh attempts per task (default: each task's max_attempts so far)")


class OutcomesQuery(Query):
    limit: int = Field(100, ge=1, le=500)
    after: UUID | None = Field(None, description="the `next_after` of the previous page")


def _selection(operator: Operator, wanted: BulkFilter) -> TaskFilter:
    organization_id = scope(operator, wanted.organization_id)
    if organization_id is None and not any((wanted.scan_id, wanted.state, wanted.task_type, wanted.worker_id)):
        raise InvalidRequest("a filter that selects every task of every organisation is refused: name an "
                             "organisation, a scan, a state, a task type or a worker")
    return TaskFilter(organization_id=organization_id, state=wanted.state, task_type=wanted.task_type,
                      scan_id=wanted.scan_id, worker_id=wanted.worker_id, created_from=wanted.created_from,
                      created_to=wanted.created_to)


def _operation(row: Any) -> BulkOperation:
    return BulkOperation.model_validate(row._asdict())


async def _read(request: web.Request, operator: Operator, operation_id: UUID) -> BulkOperation:
    async with reads(request).read() as reader:
        found = await reader.one("bulk_get", {"operation_id": operation_id})
    if found is None or not (operator.is_admin or (found.organization_id is not None
                                                   and operator.can_see(found.organization_id))):
        raise NotFound("no such bulk operation", operation_id=str(operation_id))
    return _operation(found)


@routes.route("POST", "/v1/bulk-previews",
              summary="Count the tasks a bulk operation's filter selects now (nothing changes)",
              auth="operator", request=PreviewBulkOperation, response=BulkPreview, tags=TAGS)
async def preview_bulk_operation(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    body = await read_json(request, PreviewBulkOperation)
    matched = await _services(request).bulk.preview(_selection(operator, body.filter))
    return ok(BulkPreview(action=body.action, matched=matched))


@routes.route("POST", "/v1/bulk-operations",
              summary="Start a bulk operation: cancel or retry every task the filter selects now, tracked "
                      "(202: it runs in the background; GET it for progress)",
              auth="operator", request=StartBulkOperation, response=BulkOperation, statuses=(202,), tags=TAGS,
              idempotent=True)
async def start_bulk_operation(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    key = idempotency_key(request)
    body = await read_json(request, StartBulkOperation)
    if body.attempts is not None and body.action != "retry":
        raise InvalidRequest("attempts goes with the retry action only")
    selection = _selection(operator, body.filter)
    try:
        operation_id = await _services(request).bulk.start(
            body.action, selection, reason=body.reason, attempts=body.attempts, actor=operator.actor,
            organization_id=operator.organization_id or body.filter.organization_id,
            idempotency=_idempotency(request, operator, key, "start_bulk_operation", body))
    except AlreadyCreated as first:
        operation_id = first.resource_id
    return ok(await _read(request, operator, operation_id), status=202)


@routes.route("GET", "/v1/bulk-operations", summary="Bulk operations the key can see, newest first (the last 100)",
              auth="operator", response=BulkOperationPage, tags=TAGS)
async def list_bulk_operations(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    async with reads(request).read() as reader:
        found = await reader.all("bulk_list", {"organization_id": operator.organization_id, "limit": 100})
    return ok(BulkOperationPage(items=[_operation(r) for r in found]))


@routes.route("GET", OPERATION_PATH, summary="A bulk operation and its progress", auth="operator",
              response=BulkOperation, tags=TAGS)
async def get_bulk_operation(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await _read(request, operator, _path_id(request, "operation_id", "bulk operation")))


@routes.route("GET", OPERATION_PATH + "/tasks", summary="What a bulk operation did to each task it reached",
              auth="operator", query=OutcomesQuery, response=BulkTaskOutcomePage, tags=TAGS)
async def bulk_operation_tasks(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    operation_id = _path_id(request, "operation_id", "bulk operation")
    await _read(request, operator, operation_id)
    query = read_query(request, OutcomesQuery)
    async with reads(request).read() as reader:
        found = await reader.all("bulk_tasks_page", {"operation_id": operation_id, "after_id": query.after,
                                                    "limit": query.limit + 1})
    items = [BulkTaskOutcome.model_validate(r._asdict()) for r in found[:query.limit]]
    more = len(found) > query.limit  # the page is in task id order: the next one starts after its largest
    return ok(BulkTaskOutcomePage(items=items, next_after=max(i.task_id for i in items) if more else None))


@routes.route("POST", OPERATION_PATH + "/stop",
              summary="Stop a bulk operation: the tasks it reached stay as they are, no further ones (idempotent)",
              auth="operator", response=BulkOperation, tags=TAGS)
async def stop_bulk_operation(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    operation_id = _path_id(request, "operation_id", "bulk operation")
    await _read(request, operator, operation_id)
    await _services(request).bulk.stop(operation_id)
    return ok(await _read(request, operator, operation_id))
