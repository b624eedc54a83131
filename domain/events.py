"""Domain events: the only record of what happened.

Every event is a frozen pydantic model in the style of eventsourcing's functional examples:
``originator_id`` names its stream (a task, a scan, a worker, an organisation),
``originator_version`` its position in that stream, ``timestamp`` the database time of the
transaction that recorded it, ``actor`` who caused it (``worker:<fingerprint>``,
``operator:<key id>``, ``sweeper``, ``scheduler``, ``system``).

Events are immutable once stored. To change an event's shape, bump its ``class_version`` and
add a static ``upcast_vN_vN+1(state: dict) -> None`` that rewrites old stored state in place;
eventsourcing's mapper calls them when reading (see ``persistence.codec``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict
from pydantic.dataclasses import dataclass

TaskStateName = Literal[
    "pending", "leased", "running", "retry_wait", "completed", "failed_terminal", "cancelling", "cancelled"
]
AttemptStatus = Literal["leased", "running", "succeeded", "failed", "expired", "timeout", "cancelled"]
JobStatus = Literal["queued", "running", "success", "failed", "timeout", "cancelled"]
ScanStatus = Literal["pending", "running", "success", "failed", "cancelled"]
ExecutionMode = Literal["gateway", "legacy"]


class DomainEvent(BaseModel):
    """Base of every event; subclasses add their own facts."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    class_version: ClassVar[int] = 1
    #: Optional fields added after the event was first recorded: stored only when they differ from
    #: their default (``persistence.codec``), so an event that does not use them is stored exactly
    #: as before, and both forms read back alike.
    sparse_fields: ClassVar[tuple[str, ...]] = ()
    #: The field a traced request stamps when it records the event (``persistence.transaction``:
    #: only while tracing is on and the request's trace is sampled): ``traceparent`` (the
    #: recording span's W3C context, which later work continues) or ``trace_id``.
    traced: ClassVar[str | None] = None

    originator_id: UUID
    originator_version: int
    timestamp: datetime
    actor: str


# --- organisation stream --------------------------------------------------------------------


class OrganizationCreated(DomainEvent):
    name: str


class OrganizationGatewayExecutionSet(DomainEvent):
    """Whether the organisation's new scans are Gateway-executed (an organisation starts with
    ``True``); see :func:`domain.profiles.execution_mode` for how it combines with a stored
    profile's own flag. Scans already created keep their mode."""

    enabled: bool


class OrganizationTargetPolicySet(DomainEvent):
    """The organisation's target policy (:mod:`domain.targets`), replacing the one before:
    allowed and denied networks, addresses and domains (normalised entries)."""

    allow: tuple[str, ...]
    deny: tuple[str, ...]


class OrganizationFairShareSet(DomainEvent):
    """The organisation's fair-share weight (1 to 1000; a new organisation has 1) and its cap of
    live attempts across the fleet (None: no cap), as absolute values. See :mod:`domain.fairness`."""

    weight: int
    max_live_attempts: int | None = None


class OrganizationAdmissionSet(DomainEvent):
    """The organisation's admission caps (:mod:`domain.admission`), as absolute values: at most
    ``max_queued_tasks`` tasks waiting to be leased and ``max_queued_scans`` scans not started yet
    (None: no cap, the default); ``reason`` is the operator's, as given."""

    max_queued_tasks: int | None = None
    max_queued_scans: int | None = None
    reason: str = ""


# --- worker stream --------------------------------------------------------------------------


class WorkerRegistered(DomainEvent):
    name: str
    fingerprint: str
    capabilities: tuple[str, ...]
    task_types: tuple[str, ...]
    max_concurrent_tasks: int


class WorkerUpdated(DomainEvent):
    """Capabilities, task types or capacity changed (absolute new values)."""

    capabilities: tuple[str, ...]
    task_types: tuple[str, ...]
    max_concurrent_tasks: int


class WorkerEnabledChanged(DomainEvent):
    enabled: bool


class WorkerRevoked(DomainEvent):
    reason: str


class WorkerAssigned(DomainEvent):
    organization_id: UUID


class AssignmentChanged(DomainEvent):
    """An organisation assignment was disabled, re-enabled or revoked."""

    organization_id: UUID
    enabled: bool
    revoked: bool


# --- scan stream ----------------------------------------------------------------------------


class ScanCreated(DomainEvent):
    organization_id: UUID
    targets: dict[str, Any]
    execution_mode: ExecutionMode


class ScanJobQueued(DomainEvent):
    job_id: UUID
    organization_id: UUID
    position: int
    plugin: str
    execution_mode: ExecutionMode


class ScanFinished(DomainEvent):
    status: ScanStatus


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class ProfileStep:
    """One plugin step of a scan profile: its task is created when the step is reached.

    A (pydantic) dataclass, so the event codec's orjson serialises it natively.
    """

    task_type: str
    required_capabilities: tuple[str, ...] = ()
    execution_timeout_seconds: int = 3600
    max_attempts: int = 3
    priority: int = 0
    stop_on_failure: bool = True
    lease_seconds: int = 60


class ScanProfileSet(DomainEvent):
    """The scan's ordered plugin steps; appended right after ``ScanCreated`` (same transaction).

    A separate event rather than a new ``ScanCreated`` field, so stored ``ScanCreated`` events
    (and their chain hashes) are untouched.
    """

    steps: tuple[ProfileStep, ...]


class ScanOriginRecorded(DomainEvent):
    """Where the scan came from, appended right after ``ScanCreated``/``ScanProfileSet`` (same
    transaction) when it has an origin: the stored profile its steps were copied from (the copy in
    ``ScanProfileSet`` is what runs; editing the stored profile later changes nothing here), and
    the legacy scan it stands for, with the sha256 of the legacy queue message it was drained
    from."""

    stored_profile_id: UUID | None = None
    legacy_scan_id: str | None = None
    legacy_message_sha256: str | None = None


class LegacyScanStatusRecorded(DomainEvent):
    """Progress of a legacy-executed scan as the legacy side reports it (the Gateway runs none
    of it): ``running`` once a legacy worker took it, then its outcome."""

    status: ScanStatus


class ScanHandedOver(DomainEvent):
    """A queued legacy scan moved to Gateway execution as scan ``gateway_scan_id`` (the legacy
    queue drain): this legacy record and its jobs end ``cancelled``, so the scan never runs in
    both modes."""

    gateway_scan_id: UUID
    job_ids: tuple[UUID, ...]


class ScanCancelRequested(DomainEvent):
    """No further profile steps; the scan's tasks are cancelled one by one afterwards."""

    reason: str


class ScanReopened(DomainEvent):
    """A failed scan runs again because an operator retried its failed task ``task_id`` (same
    transaction as the task's ``TaskRetried``): back to ``running``, no longer finished."""

    task_id: UUID
    reason: str


# --- task stream ----------------------------------------------------------------------------


class TaskCreated(DomainEvent):
    """A task, and what it commits to: its whole scope, of any size (:mod:`domain.scopes`).

    ``scope`` is the scope's inline part: the whole scope when its assets fit one page, else the
    scope with only their first page. Then ``scope_pages`` are the sha256s of the other pages, in
    order (stored in ``scope_pages``), ``scope_sha256`` and ``scope_bytes`` those of the whole
    scope's canonical JSON, ``scope_assets`` how many assets it holds (None: no asset list), and
    ``scope_assets_omitted`` how many assets the scan found but left out of it
    (``domain.scan.MAX_SCOPE_ASSETS``). A scope whole in ``scope``, with nothing left out, sets
    none of them (they are sparse: such an event is stored exactly as before scopes were paged).
    """

    sparse_fields: ClassVar[tuple[str, ...]] = (
        "scope_sha256", "scope_bytes", "scope_assets", "scope_pages", "scope_assets_omitted", "traceparent")
    traced: ClassVar[str | None] = "traceparent"

    scan_id: UUID
    scan_job_id: UUID
    organization_id: UUID
    task_type: str
    required_capabilities: tuple[str, ...]
    priority: int
    scope: dict[str, Any]
    parameters: dict[str, Any]
    max_attempts: int
    lease_seconds: int
    execution_timeout_seconds: int
    available_at: datetime
    scope_sha256: str | None = None
    scope_bytes: int | None = None
    scope_assets: int | None = None
    scope_pages: tuple[str, ...] = ()
    scope_assets_omitted: int = 0
    #: The W3C trace context of the request that created the task, when it was traced: the
    #: worker's run of each attempt continues that trace (``leasehold.protocol.tracing``).
    traceparent: str | None = None


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class FairShareCandidate:
    """An organisation of the worker that had an eligible task when a lease was granted."""

    organization_id: UUID
    priority: int  # of its best eligible task
    virtual_time: float
    weight: int
    live: int
    max_live_attempts: int | None = None


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class FairShareGrant:
    """Why the lease went to this organisation (:mod:`domain.fairness`): its tag among the
    eligible organisations (as read in the acquire transaction), and its state after the lease."""

    organization_id: UUID
    tag: float
    floor: float
    virtual_time: float  # the organisation's virtual time after this lease
    weight: int
    live: int  # its live attempts across the fleet, this one included
    max_live_attempts: int | None
    waited_seconds: float  # how long the task waited to be leased (since it became available)
    eligible: tuple[FairShareCandidate, ...] = ()


class TaskLeased(DomainEvent):
    sparse_fields: ClassVar[tuple[str, ...]] = ("trace_id",)
    traced: ClassVar[str | None] = "trace_id"

    scan_id: UUID
    scan_job_id: UUID
    attempt_id: UUID
    worker_id: UUID
    attempt_number: int
    lease_token_hash: str  # hex sha256 of the token; the token itself never enters the log
    lease_expires_at: datetime
    deadline_at: datetime
    request_id: str | None = None  # the worker's acquire request id, when it sent one
    fair_share: FairShareGrant | None = None  # leases granted before fair shares have none
    trace_id: str | None = None  # the trace of the request that recorded it, when traced


class LeaseReissued(DomainEvent):
    """A repeated acquire (same request id) got the same attempt with a fresh token; the old
    token, possibly lost with the first response, stops working."""

    attempt_id: UUID
    lease_token_hash: str


class TaskStarted(DomainEvent):
    """leased -> running, on the first progress report or result batch."""

    attempt_id: UUID


class LeaseRenewed(DomainEvent):
    attempt_id: UUID
    lease_expires_at: datetime


class ResultBatchAccepted(DomainEvent):
    sparse_fields: ClassVar[tuple[str, ...]] = ("trace_id",)
    traced: ClassVar[str | None] = "trace_id"

    attempt_id: UUID
    batch_id: UUID
    sequence_number: int
    idempotency_key: str
    payload_sha256: str
    record_count: int
    final: bool
    trace_id: str | None = None  # the trace of the request that recorded it, when traced


class TaskCompleted(DomainEvent):
    sparse_fields: ClassVar[tuple[str, ...]] = ("trace_id",)
    traced: ClassVar[str | None] = "trace_id"

    scan_job_id: UUID
    attempt_id: UUID
    trace_id: str | None = None  # the trace of the request that recorded it, when traced


class AttemptFailed(DomainEvent):
    """The attempt failed, as its worker reported.

    ``outcome`` is the task's next state; ``job_status`` is set when the outcome is terminal.
    ``reason`` ``"deadline"`` only occurs in events recorded before :class:`AttemptTimedOut`
    existed (they replay as they were recorded: a failed attempt).
    """

    sparse_fields: ClassVar[tuple[str, ...]] = ("trace_id",)
    traced: ClassVar[str | None] = "trace_id"

    scan_job_id: UUID
    attempt_id: UUID
    error: str
    retryable: bool
    reason: Literal["worker", "deadline"]
    outcome: Literal["retry_wait", "failed_terminal"]
    available_at: datetime | None
    job_status: JobStatus | None
    trace_id: str | None = None  # the trace of the request that recorded it, when traced


class LeaseExpired(DomainEvent):
    """The sweeper found the attempt's lease expired: retry if attempts remain."""

    scan_job_id: UUID
    attempt_id: UUID
    outcome: Literal["retry_wait", "failed_terminal"]
    available_at: datetime | None


class AttemptTimedOut(DomainEvent):
    """The attempt reached the task's execution deadline (``deadline_at``): a policy limit, not a
    lost lease. The attempt ends ``timeout``, the task ``failed_terminal`` (a plugin that ran out
    of its time would run out of it again, so a timeout is never retried) and its job ``timeout``.
    """

    scan_job_id: UUID
    attempt_id: UUID
    deadline_at: datetime


class CancelRequested(DomainEvent):
    """leased/running -> cancelling: the worker is told on its next renewal or long-poll."""

    reason: str


CancelChannel = Literal["renew", "long-poll"]


class CancelDelivered(DomainEvent):
    """The cancellation was handed to the attempt's worker for the first time: in the answer to a
    lease renewal (``renew``) or to an acquire (``long-poll``). Recorded once per cancellation;
    later answers repeat it without a new event. The task stays ``cancelling``."""

    attempt_id: UUID
    channel: CancelChannel


class AttemptRevoked(DomainEvent):
    """The Gateway ended a live attempt at once because its worker may no longer run it (the
    worker was disabled): the task is free again (``retry_wait``, available now) when attempts
    remain, else ``failed_terminal``. The worker's later writes are refused as superseded."""

    scan_job_id: UUID
    attempt_id: UUID
    reason: str
    outcome: Literal["retry_wait", "failed_terminal"]
    available_at: datetime | None


class TaskCancelled(DomainEvent):
    scan_job_id: UUID
    attempt_id: UUID | None
    reason: str


class TaskRetried(DomainEvent):
    """An operator put a ``failed_terminal`` task back to ``pending``, available at once, with
    ``max_attempts`` raised to the attempts already made plus the fresh budget. Earlier attempts
    and ``last_error`` stay as they were; the task's job is ``queued`` again."""

    scan_job_id: UUID
    reason: str
    max_attempts: int


class WriteRejected(DomainEvent):
    """A worker write was refused (stale attempt, wrong token, expired lease, cancelled task…).

    Recorded for auditors; changes no state.
    """

    command: str
    attempt_id: UUID
    reason: Literal[
        "superseded", "bad_token", "lease_expired", "cancelled", "deadline_passed", "finished",
        "not_started", "final_missing", "out_of_order", "idempotency_conflict",
    ]


TASK_EVENTS: tuple[type[DomainEvent], ...] = (
    TaskCreated, TaskLeased, LeaseReissued, TaskStarted, LeaseRenewed, ResultBatchAccepted, TaskCompleted,
    AttemptFailed, LeaseExpired, AttemptTimedOut, CancelRequested, CancelDelivered, TaskCancelled, AttemptRevoked,
    TaskRetried, WriteRejected,
)


# --- schedule stream (scheduled scans) --------------------------------------------------------

MisfirePolicy = Literal["run_once", "skip"]


class ScheduleCreated(DomainEvent):
    """A recurring scan: ``cron`` (in ``timezone``) or a fixed ``interval_seconds``, never both."""

    organization_id: UUID
    name: str
    cron: str | None
    interval_seconds: int | None
    timezone: str
    targets: dict[str, Any]
    profile: tuple[ProfileStep, ...]
    misfire_policy: MisfirePolicy
    next_run_at: datetime


class ScheduleEnabledChanged(DomainEvent):
    """Paused (``enabled`` False) or resumed; resuming moves ``next_run_at`` past the present."""

    enabled: bool
    next_run_at: datetime


class ScheduleDeleted(DomainEvent):
    """Permanent; the schedule never fires again."""


class ScheduleFired(DomainEvent):
    """One scan created for ``slot`` (``manual``: run-now, which leaves ``next_run_at`` as is)."""

    scan_id: UUID
    slot: datetime
    next_run_at: datetime
    manual: bool = False


class ScheduleSkipped(DomainEvent):
    """``slots`` missed slots dropped without a scan (misfire policy ``skip``), or the due slot
    dropped because the organisation's admission cap refused its scan (``reason`` says so)."""

    sparse_fields: ClassVar[tuple[str, ...]] = ("reason",)

    slots: int
    first_slot: datetime
    next_run_at: datetime
    reason: str | None = None


# --- stored profile stream (named, reusable scan profiles) ----------------------------------


class ProfileStored(DomainEvent):
    """A named profile of an organisation (``organization_id`` None: a global one, visible to
    every organisation), with the flag that lets its scans be Gateway-executed."""

    organization_id: UUID | None
    name: str
    steps: tuple[ProfileStep, ...]
    gateway_execution: bool


class ProfileReplaced(DomainEvent):
    """New steps for scans created from now on; existing scans keep the steps they copied."""

    steps: tuple[ProfileStep, ...]


class ProfileGatewayExecutionSet(DomainEvent):
    """``False`` makes the profile's new scans legacy-executed whatever the organisation's flag."""

    enabled: bool


class ProfileDeleted(DomainEvent):
    """The name is free again; scans created from the profile keep their steps."""
