"""The operator API: assignments."""

from __future__ import annotations

from uuid import UUID

from aiohttp import web

from leasehold.gateway.api.http import RouteTable, ok, read_json, read_query
from leasehold.gateway.api.operator.common import (
    ASSIGNMENT_PATH,
    TAGS,
    WORKER_PATH,
    _path_id,
    _see_organization,
    _services,
    read_worker,
)
from leasehold.gateway.api.operator_models import (
    AddAssignment,
    RemoveAssignmentQuery,
    Revocation,
    RevokeAssignment,
    Worker,
)
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.identity import Operator

routes = RouteTable()


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


