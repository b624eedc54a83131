"""The worker API's messages: one pydantic model per request and per answer, used by the Gateway
(which validates requests with them, builds its answers with them and publishes them in its
OpenAPI document) and by the worker agent (which parses the answers with them).

The two sides read each other differently, and that is configuration, not a copy:

* **Requests** (:class:`Request`) forbid unknown fields and bound every size: the Gateway refuses
  what it does not know (422) rather than drop it.
* **Answers** (:class:`Answer`) ignore unknown fields: an agent keeps working with a newer
  Gateway that says more. A field a Gateway added later has a default, so an older Gateway's
  answer still parses.

The lease token is a :class:`~pydantic.SecretStr` (printing a lease hides it) that travels as
plain text. Builders from the server's state live with the Gateway
(:mod:`gateway.api.worker_models`); this module needs nothing of the server.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SecretStr,
    SkipValidation,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    model_validator,
)
from typing_extensions import TypeAliasType

from leasehold.domain.limits import check_field

__all__ = [
    "INTEGRAL",
    "MAX_MULTI_REQUEST_ID",
    "MAX_TASKS_PER_ACQUIRE",
    "AcquireMore",
    "AcquireRequest",
    "AcquireResponse",
    "Answer",
    "AttemptView",
    "BatchAck",
    "BatchBody",
    "CancelNotice",
    "CompleteRequest",
    "CompleteResponse",
    "FailRequest",
    "FinalBatch",
    "Lease",
    "LeaseToken",
    "PayloadValue",
    "RenewResponse",
    "Request",
    "ResultBatchRequest",
    "ScopePageRequest",
    "ScopePageView",
    "ScopeRefView",
    "TargetPolicyView",
    "TaskStatus",
    "TaskView",
    "Token",
    "WorkerWriteRequest",
    "json_limits",
]


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


#: Put last in ``Annotated[StrictInt, Field(ge=…, le=…), INTEGRAL]``: an integer as JSON (and JSON
#: Schema) knows it, so ``5`` and ``5.0`` are the same number while ``5.5``, ``"5"`` and ``true`` are
#: not integers. (Placed before the bounds, pydantic would publish them as ``ge``/``le``.)
INTEGRAL = BeforeValidator(_integral)


def json_limits(field: str) -> AfterValidator:
    """Put in ``Annotated[dict[str, Any], json_limits("scope")]``: the field's depth and size
    limits (:data:`domain.limits.FIELD_LIMITS`), refused as 422 (too deep) or 413 (too large)
    naming the field. The error is raised past pydantic (not a ValueError) so it keeps its status."""
    def check(value: Any) -> Any:
        check_field(field, value)
        return value
    return AfterValidator(check)


Token = Annotated[str, Field(min_length=16, max_length=200, description="the lease token from acquire")]

#: The lease token in an answer: hidden when printed or logged, plain text on the wire (and in the
#: OpenAPI document, a string like any other).
LeaseToken = Annotated[SecretStr, PlainSerializer(lambda token: token.get_secret_value(), return_type=str),
                       WithJsonSchema({"type": "string"})]


#: A value inside a plugin record, as the OpenAPI document states it: any JSON, but integers within
#: 64 bits, since the payload's canonical form (orjson) exists only for those. The parsed body is
#: JSON already, so values are not validated again (a payload can hold 100,000 records);
#: integers beyond 64 bits arrive as floats and fail the payload_sha256 check.
PayloadValue = TypeAliasType("PayloadValue", (
    "None | StrictBool | Annotated[StrictInt, Field(ge=-(2**63), le=2**64 - 1)] | StrictFloat | StrictStr"
    " | list[PayloadValue] | dict[str, PayloadValue]"))


class Request(BaseModel):
    """A request body: unknown fields are refused, sizes are bounded."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Answer(BaseModel):
    """An answer: unknown fields are ignored (a newer Gateway may say more than this agent knows)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


#: The most leases one acquire grants (``max_tasks``); the worker's free capacity bounds it too.
MAX_TASKS_PER_ACQUIRE = 32
#: The longest ``request_id`` of an acquire with ``max_tasks`` above 1: its leases after the first
#: are stored under ``<request_id>#<n>``, which must fit the 200 characters of a request id.
MAX_MULTI_REQUEST_ID = 196

_MAX_TASKS_DESCRIPTION = (
    f"lease up to this many tasks in one answer (1 to {MAX_TASKS_PER_ACQUIRE}; never more than the "
    "worker's free capacity): every lease is granted by the same rules as a one-task acquire, in one "
    "transaction, and listed in `leases`")


def _check_multi_request_id(max_tasks: int, request_id: str | None) -> None:
    if max_tasks > 1 and request_id is not None and len(request_id) > MAX_MULTI_REQUEST_ID:
        raise ValueError(f"request_id must be at most {MAX_MULTI_REQUEST_ID} characters when max_tasks is above 1")


# --- requests --------------------------------------------------------------------------------


class AcquireRequest(Request):
    wait_seconds: Annotated[StrictInt, Field(ge=0, le=30), INTEGRAL] = Field(
        0, description="long-poll up to this many seconds")
    request_id: str | None = Field(
        None, min_length=1, max_length=200,
        description="makes acquire retry-safe: repeating it returns the same lease (with a fresh token); "
                    f"with max_tasks above 1, the same leases, and at most {MAX_MULTI_REQUEST_ID} characters")
    max_tasks: Annotated[StrictInt, Field(ge=1, le=MAX_TASKS_PER_ACQUIRE), INTEGRAL] | None = Field(
        None, description=_MAX_TASKS_DESCRIPTION + " (absent: one task, and the answer has no `leases`)")
    known_cancels: list[UUID] = Field(
        default_factory=list, max_length=1000,
        description="attempts the worker already knows are being cancelled: not reported again, so "
                    "the long-poll keeps waiting instead of answering them over and over")

    @model_validator(mode="after")
    def _request_id_fits(self) -> AcquireRequest:
        _check_multi_request_id(self.max_tasks or 1, self.request_id)
        return self


class AcquireMore(Request):
    """The next acquire, carried by a completion (or a failure): leases granted after it committed,
    without a long-poll."""

    max_tasks: Annotated[StrictInt, Field(ge=1, le=MAX_TASKS_PER_ACQUIRE), INTEGRAL] = Field(
        1, description=_MAX_TASKS_DESCRIPTION)
    request_id: str | None = Field(
        None, min_length=1, max_length=200,
        description="makes the carried acquire retry-safe: a repeated completion with it returns the same "
                    f"leases (fresh tokens) and leases nothing more (with max_tasks above 1, at most "
                    f"{MAX_MULTI_REQUEST_ID} characters)")

    @model_validator(mode="after")
    def _request_id_fits(self) -> AcquireMore:
        _check_multi_request_id(self.max_tasks, self.request_id)
        return self


class WorkerWriteRequest(Request):
    lease_token: Token


class BatchBody(Request):
    """A result batch: the records and what identifies them."""

    sequence_number: Annotated[StrictInt, Field(ge=1, le=1_000_000), INTEGRAL]
    idempotency_key: str = Field(min_length=1, max_length=200)
    payload_sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$",
                                description="sha256 of the canonical JSON of `payload` (keys sorted, no spaces)")
    payload: Annotated[list[dict[str, SkipValidation[PayloadValue]]], json_limits("payload")] = Field(
        max_length=100_000, description="plugin records")


class ResultBatchRequest(BatchBody, WorkerWriteRequest):
    final: StrictBool = False


class FinalBatch(BatchBody):
    """The attempt's final batch, sent with ``complete`` (it is the final one by definition)."""


_CARRY_DESCRIPTION = ("the worker's next acquire, made after this write committed (no long-poll): the answer "
                      "then carries `leases`, empty when nothing was granted or the acquire failed (the write "
                      "itself is done either way)")


class CompleteRequest(WorkerWriteRequest):
    final_batch: FinalBatch | None = Field(
        None, description="the attempt's last result batch, submitted and the task completed in one step "
                          "(exactly as POST …/results with final=true, then POST …/complete)")
    acquire: AcquireMore | None = Field(None, description=_CARRY_DESCRIPTION)


class ScopePageRequest(WorkerWriteRequest):
    page: Annotated[StrictInt, Field(ge=0, le=1_000_000), INTEGRAL] = Field(
        description="which page of the scope's assets (0 is the first, the one the lease carries inline)")


class FailRequest(WorkerWriteRequest):
    error: str = Field(max_length=20_000)
    retryable: StrictBool = True
    acquire: AcquireMore | None = Field(None, description=_CARRY_DESCRIPTION)


# --- answers ---------------------------------------------------------------------------------


class AttemptView(Answer):
    id: UUID
    attempt_number: int
    status: str
    leased_at: datetime
    lease_expires_at: datetime
    deadline_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    batch_count: int
    final_batch_accepted: bool
    error: str | None


class ScopeRefView(Answer):
    """The task's whole scope, of which ``scope`` is the inline part (its first page of assets)."""

    sha256: str = Field(description="sha256 of the whole scope's canonical JSON (orjson, keys sorted, compact)")
    bytes: int = Field(description="size of that JSON")
    assets: int | None = Field(description="how many assets the whole scope holds (null: it has no asset list)")
    pages: int = Field(description="pages of assets, the inline first one (page 0) included: read pages 1 to "
                                   "pages-1 with POST …/scope and append their assets to scope.assets in order")
    omitted: int = Field(description="assets the scan found but left out of the scope (over its limit)")


class TaskView(Answer):
    id: UUID
    scan_id: UUID
    scan_job_id: UUID
    task_type: str
    state: str
    priority: int
    scope: dict[str, Any] = Field(description="the scope's inline part: the whole scope, unless scope_ref.pages "
                                              "is above 1 (then its assets continue in further pages)")
    scope_ref: ScopeRefView | None = Field(
        None, description="the whole scope, when scope is only its first page of assets or assets were left "
                          "out of it (null: scope is the whole scope)")
    parameters: dict[str, Any]
    attempt_count: int
    max_attempts: int
    lease_seconds: int
    execution_timeout_seconds: int
    cancel_requested: bool
    last_error: str | None


class TaskStatus(Answer):
    """Every worker-write answer states the task and attempt state."""

    task: TaskView
    attempt: AttemptView | None


class ScopePageView(Answer):
    """One page of a task's scope: its assets, in order (the canonical JSON array stored, whose sha256
    the task's TaskCreated event lists)."""

    task_id: UUID
    page: int
    pages: int = Field(description="how many pages the scope's assets have")
    assets: list[Any]


class CancelNotice(Answer):
    task_id: UUID
    attempt_id: UUID


class TargetPolicyView(Answer):
    """An organisation's target policy: allowed and denied networks, addresses and domains (both
    empty: the default policy, which still denies loopback, link-local and cloud metadata)."""

    allow: list[str] = Field(default_factory=list, max_length=1000)
    deny: list[str] = Field(default_factory=list, max_length=1000)


class Lease(Answer):
    task: TaskView
    attempt: AttemptView
    attempt_id: UUID
    lease_token: LeaseToken
    lease_expires_at: datetime
    deadline_at: datetime
    target_policy: TargetPolicyView = Field(
        default_factory=TargetPolicyView,
        description="the task's organisation's target policy: the agent checks the scope's targets against it "
                    "(after resolving their names) before the plugin runs")


class AcquireResponse(Answer):
    """A new lease, and/or the worker's attempts whose tasks were cancelled (stop them)."""

    lease: Lease | None = Field(description="the first lease granted (null: none)")
    cancel_requested: list[CancelNotice]
    leases: list[Lease] | None = Field(
        None, description="every lease granted, in the order granted (`lease` is the first); present only "
                          "when the request set max_tasks")


class CompleteResponse(TaskStatus):
    """A completion's or a failure's answer; with a carried ``acquire``, the leases it granted."""

    leases: list[Lease] | None = Field(
        None, description="the leases the carried acquire granted (present only when the request carried one)")


class RenewResponse(TaskStatus):
    lease_expires_at: datetime
    cancel_requested: bool


class BatchAck(TaskStatus):
    batch_id: UUID
    sequence_number: int
    idempotency_key: str
    payload_sha256: str
    record_count: int
    final: bool
    accepted_at: datetime
    duplicate: bool = Field(description="true when this repeats an already accepted batch")
