"""The operator API: webhooks — an organisation's endpoints told of scans that ended, tasks that
failed terminally, cancellations never acknowledged and workers gone (:mod:`gateway.commands.webhooks`).

``POST /v1/webhooks`` subscribes a URL (the answer holds the signing secret, the only time it is
shown); ``GET`` lists and shows subscriptions; ``DELETE`` disables one (its pending deliveries
become dead letters); ``…/deliveries`` lists what was sent, by state; ``…/redeliver`` sends a
delivery again; ``…/test`` queues a ping. An organisation key manages its own organisation's;
another organisation's ids answer 404, as unknown ones do.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlsplit
from uuid import UUID

from aiohttp import web
from pydantic import Field, StrictStr, field_validator

from leasehold.client.models import (
    DeliveryState,
    WebhookDelivery,
    WebhookDeliveryPage,
    WebhookEventType,
    WebhookSubscription,
    WebhookSubscriptionCreated,
    WebhookSubscriptionPage,
)
from leasehold.domain.errors import InvalidRequest, NotFound
from leasehold.gateway.api.http import RouteTable, ok, read_json, read_query
from leasehold.gateway.api.operator.common import TAGS, _links, _path_id, _see_organization, _services, reads
from leasehold.gateway.api.operator.finding_work import scope
from leasehold.gateway.api.operator_models import TRIMMED, Body, Query
from leasehold.gateway.auth import operator_identity
from leasehold.gateway.identity import Operator

routes = RouteTable()
#: What the schema can say of a webhook URL (the validator checks the rest: the port's range).
URL_PATTERN = r"^https?://([^\s/?#@:\[\]]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?([/?#]\S*)?$"
WEBHOOK_PATH = "/v1/webhooks/{webhook_id}"
DELIVERY_PATH = WEBHOOK_PATH + "/deliveries/{delivery_id}"


class CreateWebhook(Body):
    organization_id: UUID | None = Field(None, description="required with an administrator key; an "
                                                           "organisation key: its own (the default)")
    url: Annotated[StrictStr, Field(min_length=1, max_length=2000, pattern=URL_PATTERN)] = Field(
        description="where notifications are POSTed: an http:// or https:// URL with a host, without credentials")
    event_types: list[WebhookEventType] | None = Field(
        None, max_length=10, description="the notifications to send (default: every type)")
    description: Annotated[StrictStr, Field(min_length=1, max_length=200, pattern=TRIMMED)] | None = None

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        try:
            parts = urlsplit(value)
            host = parts.hostname
            parts.port  # noqa: B018 - raises on a port that is not a number in range
        except ValueError as exc:
            raise ValueError(f"not a URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not host or any(c.isspace() for c in value):
            raise ValueError("expected an http:// or https:// URL with a host, e.g. https://hooks.example.com/leasehold")
        if parts.username is not None or parts.password is not None:
            raise ValueError("credentials in the URL are refused: the signature authenticates the sender")
        return value


class DeliveriesQuery(Query):
    state: DeliveryState | None = Field(None, description="pending, delivered or dead (default: all)")
    limit: int = Field(100, ge=1, le=500)


def _subscription(row: Any) -> WebhookSubscription:
    return WebhookSubscription.model_validate(row._asdict())


def _delivery(row: Any) -> WebhookDelivery:
    state = "dead" if row.dead_lettered_at else "delivered" if row.delivered_at else "pending"
    values = row._asdict()
    if state != "pending":
        values["next_attempt_at"] = None
    return WebhookDelivery.model_validate({**values, "state": state})


async def _read(request: web.Request, operator: Operator, subscription_id: UUID) -> WebhookSubscription:
    async with reads(request).read() as reader:
        found = await reader.one("webhook_subscription_get", {"subscription_id": subscription_id})
    if found is None or not operator.can_see(found.organization_id):
        raise NotFound("no such webhook", webhook_id=str(subscription_id))
    return _subscription(found)


async def _read_delivery(request: web.Request, subscription_id: UUID, delivery_id: UUID) -> WebhookDelivery:
    async with reads(request).read() as reader:
        found = await reader.one("webhook_delivery_get", {"id": delivery_id, "subscription_id": subscription_id})
    if found is None:
        raise NotFound("no such delivery", delivery_id=str(delivery_id))
    return _delivery(found)


@routes.route("POST", "/v1/webhooks",
              summary="Subscribe a URL to an organisation's notifications (the answer holds the signing "
                      "secret: the only time it is shown)",
              auth="operator", request=CreateWebhook, response=WebhookSubscriptionCreated, statuses=(201,),
              tags=TAGS, links=_links("webhook_id", "get_webhook_get", "delete_webhook_delete",
                                      "webhook_deliveries_get", "test_webhook_post"))
async def create_webhook(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    body = await read_json(request, CreateWebhook)
    org_id = body.organization_id or operator.organization_id
    if org_id is None:
        raise InvalidRequest("organization_id is required with an administrator key")
    _see_organization(operator, org_id)
    subscription_id, secret = await _services(request).webhooks.create(
        org_id, body.url, event_types=list(body.event_types or []), description=body.description,
        actor=operator.actor)
    created = await _read(request, operator, subscription_id)
    return ok(WebhookSubscriptionCreated(**created.model_dump(), secret=secret), status=201)


@routes.route("GET", "/v1/webhooks", summary="Webhook subscriptions the key can see, newest first (the last 500)",
              auth="operator", response=WebhookSubscriptionPage, tags=TAGS)
async def list_webhooks(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    async with reads(request).read() as reader:
        found = await reader.all("webhook_subscriptions_list",
                                 {"organization_id": scope(operator, None), "limit": 500})
    return ok(WebhookSubscriptionPage(items=[_subscription(r) for r in found]))


@routes.route("GET", WEBHOOK_PATH, summary="A webhook subscription (never its secret)", auth="operator",
              response=WebhookSubscription, tags=TAGS)
async def get_webhook(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    return ok(await _read(request, operator, _path_id(request, "webhook_id", "webhook")))


@routes.route("DELETE", WEBHOOK_PATH,
              summary="Disable a webhook subscription: nothing more is sent to it, its pending deliveries "
                      "become dead letters (idempotent)",
              auth="operator", response=WebhookSubscription, tags=TAGS)
async def delete_webhook(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    subscription_id = _path_id(request, "webhook_id", "webhook")
    await _read(request, operator, subscription_id)
    await _services(request).webhooks.disable(subscription_id)
    return ok(await _read(request, operator, subscription_id))


@routes.route("GET", WEBHOOK_PATH + "/deliveries",
              summary="A webhook subscription's deliveries, newest first, by state (pending, delivered, dead)",
              auth="operator", query=DeliveriesQuery, response=WebhookDeliveryPage, tags=TAGS)
async def webhook_deliveries(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    subscription_id = _path_id(request, "webhook_id", "webhook")
    await _read(request, operator, subscription_id)
    query = read_query(request, DeliveriesQuery)
    async with reads(request).read() as reader:
        found = await reader.all("webhook_deliveries_list", {"subscription_id": subscription_id,
                                                             "state": query.state, "limit": query.limit})
    return ok(WebhookDeliveryPage(items=[_delivery(r) for r in found]))


@routes.route("POST", DELIVERY_PATH + "/redeliver",
              summary="Send a delivery again now, whatever its state, with a fresh budget of attempts (same id: "
                      "receivers that deduplicate see it once)",
              auth="operator", response=WebhookDelivery, statuses=(202,), tags=TAGS)
async def redeliver_webhook(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    subscription_id = _path_id(request, "webhook_id", "webhook")
    delivery_id = _path_id(request, "delivery_id", "delivery")
    await _read(request, operator, subscription_id)
    await _read_delivery(request, subscription_id, delivery_id)
    await _services(request).webhooks.redeliver(subscription_id, delivery_id)
    return ok(await _read_delivery(request, subscription_id, delivery_id), status=202)


@routes.route("POST", WEBHOOK_PATH + "/test",
              summary="Queue a test ping (type `webhook.test`) to a webhook subscription",
              auth="operator", response=WebhookDelivery, statuses=(202,), tags=TAGS)
async def test_webhook(request: web.Request) -> web.StreamResponse:
    operator = await operator_identity(request)
    subscription_id = _path_id(request, "webhook_id", "webhook")
    subscription = await _read(request, operator, subscription_id)
    delivery_id = await _services(request).webhooks.test(subscription_id, subscription.organization_id,
                                                         operator.actor)
    return ok(await _read_delivery(request, subscription_id, delivery_id), status=202)
