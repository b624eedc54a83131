"""The operator API: organisations."""

from __future__ import annotations

from aiohttp import web

from leasehold.gateway.api.http import RouteTable, ok, read_json, read_query
from leasehold.gateway.api.operator.api_keys import _created
from leasehold.gateway.api.operator.common import (
    TAGS,
    _next_after,
    _organization,
    _path_id,
    _seen_organization,
    _services,
    reads,
)
from leasehold.gateway.api.operator_models import (
    ApiKeyCreated,
    CreateApiKey,
    CreateOrganization,
    Organization,
    OrganizationPage,
    PageQuery,
)
from leasehold.gateway.auth import operator_identity

routes = RouteTable()


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


