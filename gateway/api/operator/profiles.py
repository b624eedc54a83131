"""The operator API: stored profiles and execution modes."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from aiohttp import web

from leasehold.domain import targets as target_rules
from leasehold.domain.errors import Forbidden, InvalidRequest, NotFound
from leasehold.domain.events import ProfileStep
from leasehold.gateway.api.http import RouteTable, ok, read_json
from leasehold.gateway.api.operator.common import (
    TAGS,
    _organization,
    _path_id,
    _see_organization,
    _seen_organization,
    _services,
    read_scan,
)
from leasehold.gateway.api.operator_models import (
    Admission,
    CreateProfile,
    FairShare,
    GatewayExecution,
    LegacyStatus,
    Organization,
    ProfileDeletion,
    ProfileStepBody,
    ReplaceProfile,
    Scan,
    SetAdmission,
    SetFairShare,
    SetTargetPolicy,
    StoredProfile,
    StoredProfilePage,
    TargetPolicy,
)
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.identity import Operator

routes = RouteTable()


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


@routes.route("GET", "/v1/organizations/{organization_id}/admission",
              summary="The organisation's admission caps and the queued work they count (an organisation key: "
                      "its own)",
              auth="operator", response=Admission, tags=TAGS)
async def get_admission(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    org_id = _path_id(request, "organization_id", "organisation")
    _see_organization(operator, org_id)
    state = await _services(request).registry.admission(org_id)
    if state is None:
        raise NotFound("no such organisation", organization_id=str(org_id))
    return ok(Admission.of(state))


@routes.route("PUT", "/v1/organizations/{organization_id}/admission",
              summary="Set the organisation's caps of queued tasks and queued scans, with a reason (administrator)",
              auth="operator", request=SetAdmission, response=Admission, tags=TAGS)
async def set_admission(request: web.Request) -> web.StreamResponse:
    operator, org_id = await _seen_organization(request)
    operator.require_admin()
    body = await read_json(request, SetAdmission)
    state = await _services(request).registry.set_admission(
        org_id, max_queued_tasks=body.max_queued_tasks, max_queued_scans=body.max_queued_scans,
        reason=body.reason, actor=operator.actor)
    return ok(Admission.of(state))


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


