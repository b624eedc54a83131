"""The operator API: API keys (administrator)."""

from __future__ import annotations

from uuid import UUID

from aiohttp import web

from leasehold.gateway.api.http import RouteTable, ok, read_json, read_query
from leasehold.gateway.api.operator.common import TAGS, _links, _next_after, _path_id, _services
from leasehold.gateway.api.operator_models import (
    ApiKeyCreated,
    ApiKeyPage,
    ApiKeysQuery,
    ApiKeyView,
    CreateAnyApiKey,
    RotateApiKey,
)
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.commands.registry import IssuedKey
from leasehold.gateway.identity import Operator

routes = RouteTable()


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


