"""The webhook sender of a Gateway process: every ``webhook_interval_seconds`` it notices workers
gone since the last pass (at most every ``gone_every`` seconds), then sends the due deliveries of
the outbox, a batch at a time, until none is due.

Each delivery is a ``POST`` of its JSON body, signed as Standard Webhooks says: the headers
``webhook-id`` (the notification id: the same at every attempt, what receivers deduplicate by),
``webhook-timestamp`` (Unix seconds when sent: receivers refuse old ones, so a captured request
cannot be replayed later) and ``webhook-signature`` (``v1,`` and the base64 HMAC-SHA256, keyed
by the subscription's secret, of ``{id}.{timestamp}.{body}``). A 2xx answer delivers it; anything
else (another status, a refused connection, no answer within the timeout) is retried after an
exponential backoff with jitter, and after ``max_attempts`` sends it becomes a dead letter that
an operator can redeliver. Racing senders never send one row at once (:meth:`Webhooks.claim`);
a sender killed mid-send leaves its rows due again once their claim's lease has passed, so a
notification may arrive more than once, but is never lost.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import aiohttp

from leasehold.domain.retry import RetryPolicy
from leasehold.gateway.background.loops import every
from leasehold.gateway.commands.webhooks import SECRET_PREFIX, Claimed, Outcome, Webhooks

log = logging.getLogger("leasehold.webhooks")
USER_AGENT = "leasehold-webhooks/1"


def sign(secret: str, delivery_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header of a delivery (Standard Webhooks, version ``v1``)."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    digest = hmac.new(key, f"{delivery_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


@dataclass(slots=True)
class Sender:
    """What sending needs: the outbox, the HTTP session, and the retry rules."""

    webhooks: Webhooks
    session: aiohttp.ClientSession
    timeout: float
    max_attempts: int
    backoff: RetryPolicy
    batch: int = 20
    rng: random.Random = field(default_factory=random.Random)
    #: Told each send's outcome: ``delivered``, ``retry`` or ``dead`` (the Gateway's metrics).
    on_send: Callable[[str], None] = lambda outcome: None

    @property
    def lease(self) -> timedelta:
        """How long a claim holds its rows: longer than a batch's sends (side by side) and their
        records can take, so a live sender's row is never taken by another."""
        return timedelta(seconds=2 * self.timeout + 1)

    async def send_due(self, *, budget: float = 30.0) -> int:
        """Send the due deliveries, a batch at a time, until none is due or ``budget`` seconds have
        passed (a pass ends, so a long backlog still shows the loop passing); how many were sent
        (delivered or not)."""
        sent = 0
        deadline = time.monotonic() + budget
        while True:
            claimed = await self.webhooks.claim(limit=self.batch, lease=self.lease)
            if claimed:  # side by side, then their outcomes in one transaction
                outcomes = await asyncio.gather(*(self.send(d) for d in claimed))
                await self.webhooks.record(outcomes, max_attempts=self.max_attempts)
                for outcome in outcomes:
                    self.on_send("delivered" if outcome.error is None else
                                 "dead" if outcome.delivery.attempts >= self.max_attempts else "retry")
            sent += len(claimed)
            if len(claimed) < self.batch or time.monotonic() >= deadline:
                return sent

    async def send(self, delivery: Claimed) -> Outcome:
        """One attempt of ``delivery``; how it went (recorded by the caller)."""
        body = delivery.body()
        timestamp = int(time.time())
        headers = {"content-type": "application/json", "user-agent": USER_AGENT,
                   "webhook-id": str(delivery.id), "webhook-timestamp": str(timestamp),
                   "webhook-signature": sign(delivery.secret, str(delivery.id), timestamp, body)}
        status: int | None = None
        try:
            async with self.session.post(delivery.url, data=body, headers=headers, allow_redirects=False,
                                         timeout=aiohttp.ClientTimeout(total=self.timeout)) as reply:
                status = reply.status
            if 200 <= status < 300:
                return Outcome(delivery, status)
            error = f"answered {status}"
        except TimeoutError:
            error = f"no answer within {self.timeout:g} s"
        except aiohttp.ClientError as exc:
            error = f"{type(exc).__name__}: {exc}"
        dead = delivery.attempts >= self.max_attempts
        log.log(logging.WARNING if dead else logging.INFO,
                "webhook delivery dead-lettered" if dead else "webhook delivery failed; retried after a backoff",
                extra={"delivery_id": str(delivery.id), "subscription_id": str(delivery.subscription_id),
                       "attempt": delivery.attempts, "status": status, "error": error})
        return Outcome(delivery, status, error, self.backoff.delay(delivery.attempts, self.rng.random()))


#: How often a sender with no enabled subscription to serve looks again (seconds): until one
#: exists, a pass runs no statement, so webhooks cost an idle Gateway's database nothing.
SUBSCRIBED_RECHECK_SECONDS = 30.0


async def run(sender: Sender, interval: float, *, idle: timedelta, gone_every: float,
              on_pass: Callable[[int], None] | None = None,
              recheck: float = SUBSCRIBED_RECHECK_SECONDS) -> None:
    """Forever: notice gone workers (every ``gone_every`` seconds), send what is due, wait
    ``interval`` — while some subscription is enabled (read every ``recheck`` seconds)."""
    noticed_at = float("-inf")

    async def step() -> int:
        nonlocal noticed_at
        if not await sender.webhooks.subscribed(recheck=recheck):
            return 0
        if time.monotonic() - noticed_at >= gone_every:
            await sender.webhooks.notice_gone_workers(idle)
            noticed_at = time.monotonic()
        return await sender.send_due()

    await every(interval, step, name="webhooks", on_pass=on_pass)


def session() -> aiohttp.ClientSession:
    """The sender's HTTP client: no cookies kept between receivers."""
    return aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
