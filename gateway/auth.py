"""Who is calling: workers by their client certificate, operators by bearer API key.

Worker identity comes from mTLS only: the SHA-256 fingerprint of the peer certificate, whose
worker's standing is checked on every request (by the command's own transaction, see
:func:`worker_identity`), so disabling or revoking a worker bites on the next request of an
already open keep-alive connection. Organisation, capabilities and capacity always come
from the database, never from the request.
"""

from __future__ import annotations

import logging
import math

from aiohttp import web

from leasehold.domain.errors import Forbidden, LeaseholdError
from leasehold.gateway.commands.registry import ApiKey
from leasehold.gateway.identity import Operator, WorkerIdentity
from leasehold.gateway.keys import (
    AUTH_FAILURES,
    BUCKETS,
    CERTIFICATES,
    METRICS,
    OPERATOR,
    SERVICES,
    WORKER,
    WORKER_FINGERPRINT,
)
from leasehold.gateway.tls import client_certificate_problem, fingerprint_of_der, peer_certificate
from leasehold.protocol.logs import LOG_CONTEXT

log = logging.getLogger("leasehold.gateway")


class Unauthorized(LeaseholdError):
    """Authentication is required."""
    status = 401
    code = "unauthorized"


class RateLimited(LeaseholdError):
    """Too many requests; slow down."""
    status = 429
    code = "rate-limited"


async def worker_identity(request: web.Request) -> WorkerIdentity:
    """The calling worker, from its client certificate (403 when unknown, disabled or revoked).

    The first request of a certificate in this process looks the worker up and checks its
    standing here. Later ones take the worker from :class:`KnownCertificates` without a query:
    every worker route passes ``identity.fingerprint`` to its command, which checks the
    worker's standing in the command's own transaction (same answer, same 403), so revoking or
    disabling a worker still bites on its next request, on an open keep-alive connection too,
    without a second transaction per request. A new worker route must do the same.
    """
    cached = request.get(WORKER)
    if cached is not None:
        return cached
    der = peer_certificate(request.transport.get_extra_info("ssl_object") if request.transport else None)
    if der is None:
        raise Forbidden("a client certificate is required on the worker API")
    fingerprint = fingerprint_of_der(der)
    request[WORKER_FINGERPRINT] = fingerprint
    wait = request.app[BUCKETS].take(fingerprint)
    if wait > 0:
        raise RateLimited("rate limit exceeded for this certificate", retry_after=math.ceil(wait))
    known = request.app[CERTIFICATES]
    identity = known.get(fingerprint)
    if identity is None:
        # Checked once per certificate and process (a fit one is then remembered below), before
        # anything is read from the database.
        problem = client_certificate_problem(der)
        if problem is not None:
            log.warning("a worker certificate unfit for client authentication was refused",
                        extra={"fingerprint": fingerprint, "reason": problem})
            raise Forbidden(problem, fingerprint=fingerprint)
        worker_id, name = await request.app[SERVICES].registry.worker_by_certificate(fingerprint)
        identity = WorkerIdentity(worker_id, name, fingerprint)
        known.remember(identity)
    request[WORKER] = identity
    return identity


async def checked_api_key(request: web.Request, key: str, *, door: str) -> ApiKey | None:
    """The live operator key ``key`` is (None: unknown, revoked or expired), within the failure
    budgets of the caller's address and of the key's prefix (:class:`gateway.identity.FailureBudgets`):
    with either spent, RateLimited (429, Retry-After) before the key is looked up. ``door``
    names the way in for the metrics (``api``, ``console``)."""
    budgets, metrics = request.app[AUTH_FAILURES], request.app[METRICS]
    source = request.remote or "unknown"
    wait, budget = budgets.blocked(source, key)
    if wait > 0:
        metrics.auth_throttled.labels(door, budget or "source").inc()
        log.warning("operator authentication throttled: too many failures", extra={
            "door": door, "budget": budget, "source": source, "retry_after_seconds": math.ceil(wait)})
        raise RateLimited("too many failed authentications from this address or with this key prefix; "
                          "try again later", retry_after=math.ceil(wait))
    found = await request.app[SERVICES].registry.api_key(key)
    if found is None:
        budgets.failed(source, key)
        metrics.auth_failures.labels(door).inc()
    return found


async def operator_identity(request: web.Request) -> Operator:
    """The calling operator, from ``Authorization: Bearer <key>`` (401 when missing or unknown)."""
    cached = request.get(OPERATOR)
    if cached is not None:
        return cached
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("send an operator API key as 'Authorization: Bearer <key>'")
    found = await checked_api_key(request, key.strip(), door="api")
    if found is None:
        raise Unauthorized("unknown or revoked API key")
    operator = Operator(key_id=found.id, name=found.name, organization_id=found.organization_id)
    request[OPERATOR] = operator
    context = LOG_CONTEXT.get()
    if context is not None:  # the request's log lines from here on name the key
        context["operator_key_id"] = str(operator.key_id)
    return operator
