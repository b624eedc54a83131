"""Who a request comes from, as the Gateway keeps it: a worker (its certificate), an operator
(its API key), and the per-process state of the worker API's guard (rate buckets, known
certificates)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from uuid import UUID

from leasehold.domain.errors import Forbidden


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


class TokenBuckets:
    """Token buckets by key: ``burst`` at once, one more every ``1 / rate`` seconds (in process;
    each Gateway process counts on its own). Memory stays bounded under key churn."""
    def __init__(self, rate: float, burst: int, limit: int = 100_000) -> None:
        self.rate, self.burst, self.limit = rate, burst, limit
        self._buckets: dict[str, tuple[float, float]] = {}

    def _tokens(self, key: str, now: float) -> float:
        tokens, last = self._buckets.get(key, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - last) * self.rate)

    def wait(self, key: str, now: float | None = None) -> float:
        """Seconds until ``key`` has a token (0: now), spending nothing."""
        tokens = self._tokens(key, time.monotonic() if now is None else now)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def charge(self, key: str, now: float | None = None) -> None:
        """Spend one token of ``key`` whether or not it has one (a bucket may go below zero)."""
        now = time.monotonic() if now is None else now
        if len(self._buckets) >= self.limit:
            self._buckets.clear()
        self._buckets[key] = (self._tokens(key, now) - 1, now)

    def take(self, key: str) -> float:
        """Per-certificate rate limiting: 0 when allowed (one token spent), else seconds until a
        request would be (nothing spent)."""
        now = time.monotonic()
        waiting = self.wait(key, now)
        if waiting == 0:
            self.charge(key, now)
        return waiting


class FailureBudgets:
    """Failed authentications (unknown, revoked or expired operator API keys, at the API and at the
    console's sign-in) allowed per source address and per key prefix: ``burst`` at once, one
    more every ``1 / rate`` seconds. Spent, every further attempt from that source, or with that
    prefix, is refused (429) before the key is looked up: guessing keys costs the database
    nothing, and one key's holder is not locked out by a stranger guessing from elsewhere unless
    the stranger guesses that key's own prefix. In process: each Gateway process counts its own.
    """

    #: How much of a presented key names its prefix (``lh_`` and 9 characters of its secret).
    PREFIX = 12

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets = TokenBuckets(rate, burst)

    def _budgets(self, source: str, key: str) -> tuple[tuple[str, str], ...]:
        return (("source", f"source:{source}"), ("prefix", f"prefix:{key[:self.PREFIX]}"))

    def blocked(self, source: str, key: str) -> tuple[float, str | None]:
        """Seconds until an attempt from ``source`` with ``key`` may be made (0: now), and which
        budget is spent (``source`` or ``prefix``)."""
        now = time.monotonic()
        for kind, bucket in self._budgets(source, key):
            waiting = self._buckets.wait(bucket, now)
            if waiting > 0:
                return waiting, kind
        return 0.0, None

    def failed(self, source: str, key: str) -> None:
        """One failed attempt from ``source`` with ``key``: charged to both budgets."""
        now = time.monotonic()
        for _, bucket in self._budgets(source, key):
            self._buckets.charge(bucket, now)


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
