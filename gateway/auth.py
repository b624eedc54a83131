"""Who is calling: workers by their client certificate, operators by bearer API key.

Worker identity comes from mTLS only: the SHA-256 fingerprint of the peer certificate, whose
worker's standing is checked on every request (by the command's own transaction, see
:func:`worker_identity`), so disabling or revoking a worker bites on the next request of an
already open keep-alive connection. Organisation, capabilities and capacity always come
from the database, never from the request.
"""

from __future__ import annotations

import hashlib
import math
import time
import uuid
from dataclasses import dataclass
from uuid import UUID

from aiohttp import web

from domain.errors import Forbidden, LeaseholdError
from gateway.keys import POOL, SETTINGS, WORKER_FINGERPRINT
from gateway.tls import peer_fingerprint
from persistence.queries import QUERIES
from persistence.task_rows import caller_standing


class Unauthorized(LeaseholdError):
    """Authentication is required."""
    status = 401
    code = "unauthorized"


class RateLimited(LeaseholdError):
    """Too many requests; slow down."""
    status = 429
    code = "rate-limited"


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    id: UUID
    name: str
    fingerprint: str

    @property
    def actor(self) -> str:
        return f"worker:{self.fingerprint}"


@dataclass(frozen=True, slots=True)
class Operator:
    key_id: UUID
    name: str
    organization_id: UUID | None  # None: administrator

    @property
    def actor(self) -> str:
        return f"operator:{self.key_id}"

    @property
    def is_admin(self) -> bool:
        return self.organization_id is None

    def require_admin(self) -> None:
        if not self.is_admin:
            raise Forbidden("this needs an administrator key")

    def can_see(self, organization_id: UUID) -> bool:
        return self.is_admin or self.organization_id == organization_id


WORKER = web.RequestKey("worker", WorkerIdentity)
OPERATOR = web.RequestKey("operator", Operator)


def hash_api_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class TokenBuckets:
    """Per-certificate rate limiting (in process; each Gateway process limits on its own)."""
    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key: str) -> float:
        """0 when allowed, else seconds until a request would be."""
        now = time.monotonic()
        tokens, last = self._buckets.get(key, (float(self.burst), now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens >= 1:
            self._buckets[key] = (tokens - 1, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > 100_000:  # bounded memory under certificate churn
            self._buckets.clear()
        return (1 - tokens) / self.rate


BUCKETS = web.AppKey("rate_buckets", TokenBuckets)


class KnownCertificates:
    """Certificate fingerprint -> the worker it was registered for, as far as this process has
    seen it. The mapping never changes (a fingerprint is unique and a worker keeps its id), so it
    can be remembered; whether that worker may still act cannot, and is checked by the command
    itself, in its own transaction (the ``fingerprint`` argument of the worker commands)."""
    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._known: dict[str, WorkerIdentity] = {}

    def get(self, fingerprint: str) -> WorkerIdentity | None:
        return self._known.get(fingerprint)

    def remember(self, identity: WorkerIdentity) -> None:
        if len(self._known) >= self.limit:  # bounded memory under certificate churn
            self._known.clear()
        self._known[identity.fingerprint] = identity


CERTIFICATES = web.AppKey("known_certificates", KnownCertificates)


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
    fingerprint = peer_fingerprint(request.transport.get_extra_info("ssl_object") if request.transport else None)
    if fingerprint is None:
        raise Forbidden("a client certificate is required on the worker API")
    request[WORKER_FINGERPRINT] = fingerprint
    wait = request.app[BUCKETS].take(fingerprint)
    if wait > 0:
        raise RateLimited("rate limit exceeded for this certificate", retry_after=math.ceil(wait))
    known = request.app[CERTIFICATES]
    identity = known.get(fingerprint)
    if identity is None:
        async with request.app[POOL].connection() as conn:
            cur = await conn.execute(QUERIES["worker_by_fingerprint"], {"fingerprint": fingerprint})
            worker_id, name = caller_standing(await cur.fetchone())
        identity = WorkerIdentity(worker_id, name, fingerprint)
        known.remember(identity)
    request[WORKER] = identity
    return identity


async def operator_identity(request: web.Request) -> Operator:
    """The calling operator, from ``Authorization: Bearer <key>`` (401 when missing or unknown)."""
    cached = request.get(OPERATOR)
    if cached is not None:
        return cached
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("send an operator API key as 'Authorization: Bearer <key>'")
    async with request.app[POOL].connection() as conn:
        cur = await conn.execute(QUERIES["api_key_by_hash"], {"key_hash": hash_api_key(key.strip())})
        row = await cur.fetchone()
    if row is None:
        raise Unauthorized("unknown or revoked API key")
    operator = Operator(key_id=row[0], name=row[1], organization_id=row[2])
    request[OPERATOR] = operator
    return operator


async def ensure_bootstrap_admin_key(app: web.Application) -> None:
    """Store the administrator key given in the settings (hashed), if any."""
    key = app[SETTINGS].admin_api_key
    if not key:
        return

    async with app[POOL].connection() as conn:
        await conn.execute(QUERIES["api_key_insert"], {"id": uuid.uuid4(), "name": "bootstrap administrator",
                                                       "organization_id": None, "key_hash": hash_api_key(key)})
