"""Idempotent creation: a creating request that carries an ``Idempotency-Key`` creates once.

Inside the creating command's transaction, :func:`claim` takes the key (scope, key) before
anything is written: a new key is inserted, and the command creates and then records what it
made (:func:`created`), all in one COMMIT. A key already taken answers for the first request:
the same operation and request (sha256 of method, path and body) gets the first request's
resource id (and the command creates nothing); another request under the same key is a 409. Two
requests racing with one key serialise on the key's primary key: the second waits for the
first's transaction and then finds its row (or, if the first rolled back, takes the key itself).
Keys expire after :data:`IDEMPOTENCY_TTL`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import orjson

from leasehold.domain.errors import Conflict
from leasehold.persistence.transaction import Transaction

__all__ = ["IDEMPOTENCY_TTL", "AlreadyCreated", "IdempotencyKey", "IdempotencyKeyReused", "claim", "created"]

#: How long a key answers for its first request.
IDEMPOTENCY_TTL = timedelta(hours=24)


class AlreadyCreated(Exception):
    """The key's first request created ``resource_id``: this one creates nothing (its transaction
    is rolled back) and answers with that resource."""

    def __init__(self, resource_id: UUID) -> None:
        super().__init__(f"already created: {resource_id}")
        self.resource_id = resource_id


class IdempotencyKeyReused(Conflict):
    """This Idempotency-Key was used for another request: use a new key for a new request."""

    code = "idempotency-key-reused"


@dataclass(frozen=True, slots=True)
class IdempotencyKey:
    """A creating request's key: who (``scope``), the key, the operation and the request's hash."""

    scope: str
    key: str
    operation: str
    request_sha256: bytes

    @classmethod
    def of(cls, *, organization_id: UUID | None, key: str, operation: str, method: str, path: str,
           body: Any) -> IdempotencyKey:
        scope = f"org:{organization_id}" if organization_id is not None else "admin"
        request = orjson.dumps([method, path, body], option=orjson.OPT_SORT_KEYS)
        return cls(scope, key, operation, hashlib.sha256(request).digest())

    def params(self, now: datetime | None) -> dict[str, Any]:
        return {"scope": self.scope, "key": self.key, "operation": self.operation,
                "request_sha256": self.request_sha256, "now": now, "ttl": IDEMPOTENCY_TTL}


async def claim(tx: Transaction, idempotency: IdempotencyKey | None, now: datetime | None) -> None:
    """Take the key in ``tx``: return when it is this request's to use (create, then call
    :func:`created`); raise :class:`AlreadyCreated` with what the key's first request created, or
    :class:`IdempotencyKeyReused` when the key was used for another request."""
    if idempotency is None:
        return
    params = idempotency.params(now)
    await tx.execute("idempotency_forget_expired", params)
    if await tx.one("idempotency_claim", params) is not None:
        return
    first = await tx.one("idempotency_first", params)
    if first is None:  # taken and expired in between: a race with a purge; the caller may retry
        raise Conflict("this Idempotency-Key is being reused; retry the request")
    if first.operation != idempotency.operation or bytes(first.request_sha256) != idempotency.request_sha256:
        raise IdempotencyKeyReused()
    if first.resource_id is None:
        raise IdempotencyKeyReused("this Idempotency-Key's first request created nothing")
    raise AlreadyCreated(first.resource_id)


def created(tx: Transaction, idempotency: IdempotencyKey | None, resource_id: UUID) -> None:
    """Record, in the creating transaction, what the key's request created."""
    if idempotency is not None:
        tx.write("idempotency_keys", "idempotency_created", {**idempotency.params(None), "resource_id": resource_id})
