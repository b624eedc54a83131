"""One small hierarchy for every refusal the domain can make.

Each boundary translates these once: the service layer from psycopg errors into these, the
HTTP layer from these into problem+json responses (``status`` is the suggested HTTP status).
The class docstring is the default message.
"""

from __future__ import annotations


class LeaseholdError(Exception):
    """The request could not be carried out."""

    status = 400
    code = "error"

    def __init__(self, message: str | None = None, **details: object) -> None:
        super().__init__(message or (self.__doc__ or "").strip())
        self.message = message or (self.__doc__ or "").strip()
        self.details = details


class InvalidRequest(LeaseholdError):
    """The request is malformed or violates a rule of the lifecycle."""

    status = 422
    code = "invalid-request"


class NotFound(LeaseholdError):
    """No such resource (or it belongs to someone else)."""

    status = 404
    code = "not-found"


class Forbidden(LeaseholdError):
    """The caller may not do this."""

    status = 403
    code = "forbidden"


class Conflict(LeaseholdError):
    """The request conflicts with the current state."""

    status = 409
    code = "conflict"


class InvalidTransition(Conflict):
    """The task's current state does not allow this transition."""

    code = "invalid-transition"


class LeaseLost(Conflict):
    """The lease is no longer held by this attempt (expired, superseded or wrong token)."""

    code = "lease-lost"


class TaskWasCancelled(Conflict):
    """The task has been cancelled; the attempt must stop."""

    code = "task-cancelled"


class DeadlineExceeded(Conflict):
    """The task's execution deadline has passed."""

    code = "deadline-exceeded"


class IdempotencyConflict(Conflict):
    """This idempotency key was already used with a different payload."""

    code = "idempotency-conflict"


class CapacityExhausted(Conflict):
    """The worker already runs as many tasks as it may."""

    code = "capacity-exhausted"


class Unavailable(LeaseholdError):
    """The service is temporarily unavailable; retry later."""

    status = 503
    code = "unavailable"
