"""The operator API: scheduled scans."""

from __future__ import annotations

from uuid import UUID

from aiohttp import web

from leasehold.domain.errors import InvalidRequest
from leasehold.domain.events import ProfileStep
from leasehold.gateway.api.http import RouteTable, ok, read_json
from leasehold.gateway.api.operator.common import TAGS, _links, _path_id, _see_organization, _services
from leasehold.gateway.api.operator.scans import require_targets
from leasehold.gateway.api.operator_models import (
    CreateSchedule,
    Schedule,
    ScheduleDeletion,
    SchedulePage,
    ScheduleRun,
)
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.identity import Operator

routes = RouteTable()


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
    require_targets(body.targets, has_steps=bool(body.profile))
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


