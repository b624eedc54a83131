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
