"""Webhooks: an organisation's HTTP endpoints told of what happened, from an outbox in PostgreSQL.

A notification is an outbox row (``webhook_deliveries``, migration 0027), queued by :func:`notify`
in the transaction of the change it reports, so it exists exactly when that change committed:
one row per enabled subscription of the organisation that wants its type. The commands that
cause one call :func:`notify` (a task failed terminally or a cancellation never acknowledged:
:mod:`.lifecycle.base`; a scan finished or failed: :mod:`.scans`); a worker gone is noticed by
:meth:`Webhooks.notice_gone_workers`, which queues its notifications in the statement that
records the absence.

Delivery (:mod:`gateway.background.webhooks`) takes due rows with :meth:`Webhooks.claim` and
records a batch's outcomes with :meth:`Webhooks.record`; a row is sent at least once, and its id
lets a receiver drop the repeats.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, get_args
from uuid import UUID, uuid4

import orjson

from leasehold.client.models import WebhookEventType
from leasehold.domain.errors import Conflict, InvalidRequest, NotFound
from leasehold.persistence.transaction import Clock, Database, Transaction, system_clock

__all__ = ["EVENT_TYPES", "TEST_EVENT", "Claimed", "Outcome", "Webhooks", "new_secret", "notify", "notify_scan_finished"]

#: The notifications a subscription can ask for (the operator API's ``WebhookEventType``).
EVENT_TYPES: tuple[str, ...] = get_args(WebhookEventType)
#: The test ping's type: sent to the one subscription asked, whatever its filter.
TEST_EVENT = "webhook.test"
SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A subscription's signing secret, as Standard Webhooks writes one: ``whsec_`` and the
    base64 of 32 random bytes (the HMAC key is those bytes)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def notify(tx: Transaction, organization_id: UUID, event_type: str, data: dict[str, Any],
           now: datetime | None) -> None:
    """Queue the notification ``event_type`` about ``data`` to every enabled subscription of
    ``organization_id`` that wants it, in ``tx`` (it commits, or not, with the change)."""
    assert event_type in EVENT_TYPES, event_type
    tx.write("webhook_deliveries", "webhook_deliveries_enqueue", {
        "organization_id": organization_id, "event_type": event_type,
        "payload": orjson.dumps(data).decode(), "now": now})


def notify_scan_finished(tx: Transaction, organization_id: UUID, scan_id: UUID, status: str,
                         now: datetime | None) -> None:
    """A scan ended: ``scan.failed`` when it failed, else ``scan.finished`` (succeeded or cancelled)."""
    notify(tx, organization_id, "scan.failed" if status == "failed" else "scan.finished",
           {"scan_id": str(scan_id), "status": status}, now)


@dataclass(frozen=True, slots=True)
class Claimed:
    """A delivery taken for sending (the secret travels with it, never further than the signer)."""

    id: UUID
    subscription_id: UUID
    organization_id: UUID
    event_type: str
    payload: dict[str, Any]
    created_at: datetime
    attempts: int
    claims: int
    url: str
    secret: str

    def body(self) -> bytes:
        """The JSON body: the same bytes at every attempt (a retry is the same notification)."""
        return orjson.dumps({"id": str(self.id), "type": self.event_type, "timestamp": self.created_at,
                             "organization_id": str(self.organization_id), "data": self.payload})


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one send of a delivery went: ``error`` None when the receiver answered 2xx; else why
    not, and when to send it again (``retry_in``)."""

    delivery: Claimed
    status: int | None
    error: str | None = None
    retry_in: timedelta = timedelta(0)


class Webhooks:
    """Subscriptions, the outbox, and its delivery bookkeeping (see the module docstring)."""

    def __init__(self, db: Database, *, clock: Clock = system_clock,
                 new_id: Callable[[], UUID] = uuid4) -> None:
        self.db, self.clock, self.new_id = db, clock, new_id
        #: Whether some subscription is enabled, as last read (None: not read yet), and when
        #: (monotonic seconds): see :meth:`subscribed`.
        self._subscribed: bool | None = None
        self._subscribed_read_at = float("-inf")

    async def subscribed(self, *, recheck: float) -> bool:
        """Whether any subscription is enabled, read at most every ``recheck`` seconds: a sender
        with none to serve runs no statement (an idle Gateway's database stays idle). A
        subscription created, tested or redelivered through this process counts at once; one
        created through another process within ``recheck`` seconds."""
        now = time.monotonic()
        if self._subscribed is None or now - self._subscribed_read_at >= recheck:
            async with self.db.transaction() as tx:
                found = await tx.value("webhook_subscriptions_enabled", {})
                await tx.commit()
            self._subscribed, self._subscribed_read_at = bool(found.enabled), now
        return self._subscribed

    def _now_subscribed(self) -> None:
        self._subscribed, self._subscribed_read_at = True, time.monotonic()

    # --- subscriptions ---------------------------------------------------------------------

    async def create(self, organization_id: UUID, url: str, *, event_types: list[str] | None,
                     description: str | None, actor: str) -> tuple[UUID, str]:
        """A new enabled subscription; its id and its secret (the only time the secret is given)."""
        wanted = list(EVENT_TYPES) if not event_types else sorted(set(event_types))
        unknown = [t for t in wanted if t not in EVENT_TYPES]
        if unknown:
            raise InvalidRequest(f"unknown event types {unknown}: any of {', '.join(EVENT_TYPES)}")
        subscription_id, secret = self.new_id(), new_secret()
        async with self.db.transaction() as tx:
            found = await tx.one("organization_get", {"organization_id": organization_id})
            if found is None:
                raise NotFound("no such organisation", organization_id=str(organization_id))
            tx.write("webhook_subscriptions", "webhook_subscription_insert", {
                "id": subscription_id, "organization_id": organization_id, "url": url, "secret": secret,
                "event_types": wanted, "description": description, "created_by": actor, "now": self.clock()})
            await tx.commit()
        self._now_subscribed()
        return subscription_id, secret

    async def disable(self, subscription_id: UUID) -> None:
        """Stop notifying the subscription; its pending deliveries become dead letters (idempotent)."""
        async with self.db.transaction() as tx:
            params = {"subscription_id": subscription_id, "now": self.clock()}
            tx.write("webhook_subscriptions", "webhook_subscription_disable", params)
            tx.write("webhook_deliveries", "webhook_deliveries_dead_letter_subscription", params)
            await tx.commit()

    async def redeliver(self, subscription_id: UUID, delivery_id: UUID) -> None:
        """Send a delivery again (whatever its state), with a fresh budget of attempts."""
        async with self.db.transaction() as tx:
            subscription = await tx.one("webhook_subscription_get", {"subscription_id": subscription_id})
            if subscription is not None and not subscription.enabled:
                raise Conflict("the subscription is disabled: its deliveries are not sent")
            tx.write("webhook_deliveries", "webhook_delivery_redeliver",
                     {"id": delivery_id, "subscription_id": subscription_id, "now": self.clock()})
            await tx.commit()
        self._now_subscribed()

    async def test(self, subscription_id: UUID, organization_id: UUID, actor: str) -> UUID:
        """Queue a test ping to the subscription; the delivery's id."""
        delivery_id = self.new_id()
        async with self.db.transaction() as tx:
            subscription = await tx.one("webhook_subscription_get", {"subscription_id": subscription_id})
            if subscription is not None and not subscription.enabled:
                raise Conflict("the subscription is disabled: a test ping would not be sent")
            tx.write("webhook_deliveries", "webhook_delivery_insert", {
                "id": delivery_id, "subscription_id": subscription_id, "organization_id": organization_id,
                "event_type": TEST_EVENT, "payload": orjson.dumps({"requested_by": actor}).decode(),
                "now": self.clock()})
            await tx.commit()
        self._now_subscribed()
        return delivery_id

    # --- the outbox --------------------------------------------------------------------------

    async def notice_gone_workers(self, idle: timedelta) -> int:
        """Report each worker that has been gone (unseen for ``idle``) since its last sighting, once;
        how many notifications were queued."""
        async with self.db.transaction() as tx:
            found = await tx.value("worker_gone_notice", {"idle_seconds": idle.total_seconds(), "now": self.clock()})
            await tx.commit()
        return int(found.notifications)

    async def claim(self, *, limit: int, lease: timedelta) -> list[Claimed]:
        """Take up to ``limit`` due deliveries for ``lease`` (longer than a send may take)."""
        async with self.db.transaction() as tx:
            found = await tx.all("webhook_deliveries_claim", {
                "limit": limit, "lease_seconds": lease.total_seconds(), "now": self.clock()})
            await tx.commit()
        return [Claimed(id=r.id, subscription_id=r.subscription_id, organization_id=r.organization_id,
                        event_type=r.event_type, payload=r.payload, created_at=r.created_at, attempts=r.attempts,
                        claims=r.claims, url=r.url, secret=r.secret) for r in found]

    async def record(self, outcomes: list[Outcome], *, max_attempts: int) -> None:
        """Record a batch of sends in one transaction (a statement for the delivered ones, one for
        the failed ones): a failed one is due again after its ``retry_in``, or a dead letter once it
        was sent ``max_attempts`` times. An outcome of a take that lapsed meanwhile is ignored."""
        delivered = [o for o in outcomes if o.error is None]
        failed = [o for o in outcomes if o.error is not None]
        async with self.db.transaction() as tx:
            if delivered:
                tx.write("webhook_deliveries", "webhook_deliveries_delivered", {
                    "ids": [o.delivery.id for o in delivered], "claims": [o.delivery.claims for o in delivered],
                    "statuses": [o.status for o in delivered], "now": self.clock()})
            if failed:
                tx.write("webhook_deliveries", "webhook_deliveries_failed", {
                    "ids": [o.delivery.id for o in failed], "claims": [o.delivery.claims for o in failed],
                    "statuses": [o.status for o in failed], "errors": [(o.error or "")[:1000] for o in failed],
                    "retry_seconds": [o.retry_in.total_seconds() for o in failed], "max_attempts": max_attempts,
                    "now": self.clock()})
            await tx.commit()
