"""Request and response bodies of the worker API (pydantic; the OpenAPI document is built
from these). Unknown fields are rejected; sizes are bounded."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SkipValidation,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)
from typing_extensions import TypeAliasType

from leasehold.domain.scopes import ScopeRef
from leasehold.domain.task import AttemptState, TaskState
from leasehold.gateway.api.http import INTEGRAL, json_limits

Token = Annotated[str, Field(min_length=16, max_length=200, description="the lease token from acquire")]


#: A value inside a plugin record, as the OpenAPI document states it: any JSON, but integers within
#: 64 bits, since the payload's canonical form (orjson) exists only for those. The parsed body is
#: JSON already, so values are not validated again (a payload can hold 100,000 records);
#: integers beyond 64 bits arrive as floats and fail the payload_sha256 check.
PayloadValue = TypeAliasType("PayloadValue", (
    "None | StrictBool | Annotated[StrictInt, Field(ge=-(2**63), le=2**64 - 1)] | StrictFloat | StrictStr"
    " | list[PayloadValue] | dict[str, PayloadValue]"))


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AcquireRequest(Body):
    wait_seconds: Annotated[StrictInt, Field(ge=0, le=30), INTEGRAL] = Field(
        0, description="long-poll up to this many seconds")
    request_id: str | None = Field(
        None, min_length=1, max_length=200,
        description="makes acquire retry-safe: repeating it returns the same lease (with a fresh token)")
    known_cancels: list[UUID] = Field(
        default_factory=list, max_length=1000,
        description="attempts the worker already knows are being cancelled: not reported again, so "
                    "the long-poll keeps waiting instead of answering them over and over")


class WorkerWriteRequest(Body):
    lease_token: Token


class BatchBody(Body):
    """A result batch: the records and what identifies them."""

    sequence_number: Annotated[StrictInt, Field(ge=1, le=1_000_000), INTEGRAL]
    idempotency_key: str = Field(min_length=1, max_length=200)
    payload_sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$",
                                description="sha256 of the canonical JSON of `payload` (keys sorted, no spaces)")
    payload: Annotated[list[dict[str, SkipValidation[PayloadValue]]], json_limits("payload")] = Field(
        max_length=100_000,
                                                                  description="plugin records")


class ResultBatchRequest(BatchBody, WorkerWriteRequest):
    final: StrictBool = False


class FinalBatch(BatchBody):
    """The attempt's final batch, sent with ``complete`` (it is the final one by definition)."""


class CompleteRequest(WorkerWriteRequest):
    final_batch: FinalBatch | None = Field(
        None, description="the attempt's last result batch, submitted and the task completed in one step "
                          "(exactly as POST …/results with final=true, then POST …/complete)")


class ScopePageRequest(WorkerWriteRequest):
    page: Annotated[StrictInt, Field(ge=0, le=1_000_000), INTEGRAL] = Field(
        description="which page of the scope's assets (0 is the first, the one the lease carries inline)")


class FailRequest(WorkerWriteRequest):
    error: str = Field(max_length=20_000)
    retryable: StrictBool = True


class AttemptView(Body):
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

    @classmethod
    def of(cls, a: AttemptState) -> AttemptView:
        return cls(id=a.id, attempt_number=a.attempt_number, status=a.status, leased_at=a.leased_at,
                   lease_expires_at=a.lease_expires_at, deadline_at=a.deadline_at, started_at=a.started_at,
                   finished_at=a.finished_at, batch_count=a.batch_count,
                   final_batch_accepted=a.final_batch_accepted, error=a.error)


class ScopeRefView(Body):
    """The task's whole scope, of which ``scope`` is the inline part (its first page of assets)."""

    sha256: str = Field(description="sha256 of the whole scope's canonical JSON (orjson, keys sorted, compact)")
    bytes: int = Field(description="size of that JSON")
    assets: int | None = Field(description="how many assets the whole scope holds (null: it has no asset list)")
    pages: int = Field(description="pages of assets, the inline first one (page 0) included: read pages 1 to "
                                   "pages-1 with POST …/scope and append their assets to scope.assets in order")
    omitted: int = Field(description="assets the scan found but left out of the scope (over its limit)")

    @classmethod
    def of(cls, ref: ScopeRef) -> ScopeRefView:
        return cls(sha256=ref.sha256, bytes=ref.size, assets=ref.assets, pages=ref.pages, omitted=ref.omitted)


class TaskView(Body):
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

    @classmethod
    def of(cls, t: TaskState) -> TaskView:
        return cls(id=t.id, scan_id=t.scan_id, scan_job_id=t.scan_job_id, task_type=t.task_type, state=t.state,
                   priority=t.priority, scope=t.scope,
                   scope_ref=None if t.scope_ref is None else ScopeRefView.of(t.scope_ref),
                   parameters=t.parameters, attempt_count=t.attempt_count,
                   max_attempts=t.max_attempts, lease_seconds=t.lease_seconds,
                   execution_timeout_seconds=t.execution_timeout_seconds,
                   cancel_requested=t.cancel_requested_at is not None and t.state in ("cancelling", "cancelled"),
                   last_error=t.last_error)


class TaskStatus(Body):
    """Every worker-write answer states the task and attempt state."""

    task: TaskView
    attempt: AttemptView | None

    @classmethod
    def of(cls, t: TaskState) -> TaskStatus:
        return cls(task=TaskView.of(t), attempt=AttemptView.of(t.current_attempt) if t.current_attempt else None)


class ScopePageView(Body):
    """One page of a task's scope: its assets, in order (the canonical JSON array stored, whose sha256
    the task's TaskCreated event lists)."""

    task_id: UUID
    page: int
    pages: int = Field(description="how many pages the scope's assets have")
    assets: list[Any]


class CancelNotice(Body):
    task_id: UUID
    attempt_id: UUID


class TargetPolicyView(Body):
    """An organisation's target policy: allowed and denied networks, addresses and domains (both
    empty: the default policy, which still denies loopback, link-local and cloud metadata)."""

    allow: list[str] = Field(default_factory=list, max_length=1000)
    deny: list[str] = Field(default_factory=list, max_length=1000)


class Lease(Body):
    task: TaskView
    attempt: AttemptView
    attempt_id: UUID
    lease_token: str
    lease_expires_at: datetime
    deadline_at: datetime
    target_policy: TargetPolicyView = Field(
        default_factory=TargetPolicyView,
        description="the task's organisation's target policy: the agent checks the scope's targets against it "
                    "(after resolving their names) before the plugin runs")


class AcquireResponse(Body):
    """A new lease, and/or the worker's attempts whose tasks were cancelled (stop them)."""

    lease: Lease | None
    cancel_requested: list[CancelNotice]


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
