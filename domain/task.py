"""The worker-task state machine of the RFC: state, commands, ``decide`` and ``evolve``.

``decide(task, command, now=…, actor=…)`` returns the events a command produces (an empty list
when a repeated command is an idempotent no-op) or raises a :mod:`domain.errors` error when the
request is plainly invalid. A worker write that fails fencing is not an exception here: it
yields a single :class:`~domain.events.WriteRejected` event, which the service records and then
turns into the matching error (:func:`rejection_error`), so auditors see every refused write.

``evolve(task, event)`` folds one event into the state. ``project_task`` folds a whole stream.

Transitions (RFC "Task state machine"):

    pending    -> leased           acquire
    retry_wait -> leased           acquire after available_at, attempts remain
    leased     -> running          progress or first result
    running    -> running          renew lease (deadline not exceeded)
    leased|running -> retry_wait   lease expired / retryable failure, attempts remain
    leased|running -> failed_terminal  attempts exhausted / terminal failure / execution deadline
                                   reached while the lease was held (attempt ``timeout``)
    running    -> completed        complete with valid lease and an accepted final batch
    leased|running -> cancelling   cancel requested
    pending|retry_wait -> cancelled  cancel before acquire
    cancelling -> cancelling       cancel first handed to the worker (renew or acquire answer)
    cancelling -> cancelled        worker acknowledges, or server terminates
    leased|running -> retry_wait   the worker was disabled (attempt revoked), attempts remain
    cancelling -> cancelled        the worker was disabled before it acknowledged
    failed_terminal -> pending     an operator retries it (fresh attempt budget)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import singledispatch
from typing import Any
from uuid import UUID

from leasehold.domain.errors import (
    DeadlineExceeded,
    IdempotencyConflict,
    InvalidRequest,
    InvalidTransition,
    LeaseholdError,
    LeaseLost,
    TaskWasCancelled,
)
from leasehold.domain.events import (
    AttemptFailed,
    AttemptRevoked,
    AttemptStatus,
    AttemptTimedOut,
    CancelChannel,
    CancelDelivered,
    CancelRequested,
    DomainEvent,
    FairShareGrant,
    LeaseExpired,
    LeaseReissued,
    LeaseRenewed,
    ResultBatchAccepted,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskLeased,
    TaskRetried,
    TaskStarted,
    TaskStateName,
    WriteRejected,
)
from leasehold.domain.limits import check_field
from leasehold.domain.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from leasehold.domain.scopes import PagedScope, ScopeRef, page_scope

LIVE_ATTEMPT_STATUSES: frozenset[str] = frozenset({"leased", "running"})
ACQUIRABLE_STATES: frozenset[str] = frozenset({"pending", "retry_wait"})
TERMINAL_STATES: frozenset[str] = frozenset({"completed", "failed_terminal", "cancelled"})
TIMEOUT_ERROR = "execution deadline exceeded"


# --- state ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttemptState:
    """One execution attempt of a task by one worker."""

    id: UUID
    task_id: UUID
    worker_id: UUID
    attempt_number: int
    lease_token_hash: str
    status: AttemptStatus
    leased_at: datetime
    lease_expires_at: datetime
    deadline_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    batch_count: int = 0
    final_batch_accepted: bool = False
    error: str | None = None

    @property
    def live(self) -> bool:
        return self.status in LIVE_ATTEMPT_STATUSES


@dataclass(frozen=True, slots=True)
class TaskState:
    """A worker task: one scanner plugin execution of a scan job."""

    id: UUID
    version: int
    scan_id: UUID
    scan_job_id: UUID
    organization_id: UUID
    task_type: str
    required_capabilities: tuple[str, ...]
    priority: int
    scope: dict[str, Any]
    parameters: dict[str, Any]
    state: TaskStateName
    available_at: datetime
    attempt_count: int
    max_attempts: int
    lease_seconds: int
    execution_timeout_seconds: int
    created_at: datetime
    updated_at: datetime
    cancel_requested_at: datetime | None = None
    last_error: str | None = None
    finished_at: datetime | None = None
    current_attempt: AttemptState | None = field(default=None)
    cancel_delivered_at: datetime | None = None
    cancel_delivery_channel: CancelChannel | None = None
    #: The whole scope's reference when ``scope`` is only its inline part (stored pages follow), or
    #: when assets were left out of it; None: ``scope`` is the whole scope.
    scope_ref: ScopeRef | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What acquisition needs to know about the worker (always from the database, never the request)."""

    id: UUID
    enabled: bool
    revoked: bool
    max_concurrent_tasks: int
    live_attempts: int
    capabilities: frozenset[str]
    task_types: frozenset[str]


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """An accepted result batch, as the idempotency check needs it."""

    batch_id: UUID
    attempt_id: UUID
    sequence_number: int
    idempotency_key: str
    payload_sha256: str
    record_count: int
    final: bool
    accepted_at: datetime


# --- commands -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateTask:
    task_id: UUID
    scan_id: UUID
    scan_job_id: UUID
    organization_id: UUID
    task_type: str
    required_capabilities: tuple[str, ...] = ()
    priority: int = 0
    #: The scope, whole (a small one) or already cut into pages by the caller, who stores the
    #: pages (:func:`domain.scopes.page_scope`).
    scope: dict[str, Any] | PagedScope = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)
    max_attempts: int = 3
    lease_seconds: int = 60
    execution_timeout_seconds: int = 3600
    available_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class GrantLease:
    """Gateway acquire: give the task to ``worker`` as a new attempt."""

    attempt_id: UUID
    worker: WorkerView
    lease_token_hash: str
    request_id: str | None = None
    fair_share: FairShareGrant | None = None  # why the worker's organisations chose this task


@dataclass(frozen=True, slots=True)
class ReissueLease:
    """A repeated acquire with the same request id: same attempt, fresh token."""

    attempt_id: UUID
    lease_token_hash: str


@dataclass(frozen=True, slots=True)
class WorkerWrite:
    """Base of every write a worker makes on its attempt (fenced by attempt + lease token).

    ``attempt`` is the attempt the request names, as loaded from the database (it may be an
    old, superseded one); ``lease_token_hash`` is the hash of the token the request presented.
    """

    attempt: AttemptState
    lease_token_hash: str


@dataclass(frozen=True, slots=True)
class MarkRunning(WorkerWrite):
    pass


@dataclass(frozen=True, slots=True)
class Renew(WorkerWrite):
    pass


@dataclass(frozen=True, slots=True)
class SubmitBatch(WorkerWrite):
    batch_id: UUID
    sequence_number: int
    idempotency_key: str
    payload_sha256: str
    record_count: int
    final: bool
    existing: BatchRecord | None = None  # the batch already stored under this idempotency key


@dataclass(frozen=True, slots=True)
class Complete(WorkerWrite):
    pass


@dataclass(frozen=True, slots=True)
class Fail(WorkerWrite):
    error: str
    retryable: bool = True


@dataclass(frozen=True, slots=True)
class AcknowledgeCancel(WorkerWrite):
    pass


@dataclass(frozen=True, slots=True)
class ExpireLease:
    """Sweeper: the named attempt's lease has run out."""

    attempt_id: UUID


@dataclass(frozen=True, slots=True)
class ExceedDeadline:
    """Sweeper: the named attempt ran past the task's execution deadline."""

    attempt_id: UUID


@dataclass(frozen=True, slots=True)
class RequestCancel:
    reason: str = "cancel requested"


@dataclass(frozen=True, slots=True)
class TerminateCancelling:
    """Sweeper: the worker did not acknowledge the cancel within ``grace``."""

    grace: timedelta


@dataclass(frozen=True, slots=True)
class DeliverCancel:
    """Gateway: the cancellation of ``attempt_id`` is in an answer to its worker (``channel``)."""

    attempt_id: UUID
    channel: CancelChannel


@dataclass(frozen=True, slots=True)
class RevokeAttempt:
    """Gateway: end ``attempt_id`` now; its worker may no longer run it (it was disabled)."""

    attempt_id: UUID
    reason: str


#: The most attempts a task may ever have in all (the ``attempt_budget`` domain of the schema).
MAX_ATTEMPTS = 100


@dataclass(frozen=True, slots=True)
class RetryTask:
    """Operator: run a ``failed_terminal`` task again.

    The task goes back to ``pending``, available at once, with ``attempts`` fresh attempts: its
    ``max_attempts`` becomes the attempts already made plus ``attempts`` (None: as many as its
    ``max_attempts`` so far, which for a task never retried is the budget it was created with).
    At most :data:`MAX_ATTEMPTS` in all.
    """

    reason: str = "retried by an operator"
    attempts: int | None = None


Command = (
    CreateTask | GrantLease | ReissueLease | WorkerWrite | ExpireLease | ExceedDeadline | RequestCancel
    | TerminateCancelling | DeliverCancel | RevokeAttempt | RetryTask
)

#: ``TaskCancelled.reason`` when the worker acknowledged the cancellation.
ACKNOWLEDGED_BY_WORKER = "acknowledged by worker"
#: ``TaskCancelled.reason`` when the worker did not acknowledge it within the grace (the sweeper).
NOT_ACKNOWLEDGED = "not acknowledged in time; terminated by the gateway"


# --- decide ---------------------------------------------------------------------------------


def decide(
    task: TaskState | None,
    command: Command,
    *,
    now: datetime,
    actor: str,
    draw: float = 0.5,
    retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY,
) -> list[DomainEvent]:
    """Events that ``command`` produces on ``task`` at ``now`` (``draw`` in [0, 1) is the jitter)."""
    if isinstance(command, CreateTask):
        if task is not None:
            raise InvalidTransition("task already exists", task_id=str(command.task_id))
        return [_create(command, now, actor)]
    if task is None:
        raise InvalidRequest("the task does not exist yet")
    d = _Decider(task, now, actor, draw, retry_policy)
    match command:
        case GrantLease():
            return d.lease(command)
        case ReissueLease():
            return d.reissue(command)
        case MarkRunning():
            return d.mark_running(command)
        case Renew():
            return d.renew(command)
        case SubmitBatch():
            return d.submit_batch(command)
        case Complete():
            return d.complete(command)
        case Fail():
            return d.fail(command)
        case AcknowledgeCancel():
            return d.acknowledge_cancel(command)
        case WorkerWrite():
            raise TypeError(f"unknown worker write {command!r}")
        case ExpireLease():
            return d.expire_lease(command)
        case ExceedDeadline():
            return d.exceed_deadline(command)
        case RequestCancel():
            return d.request_cancel(command)
        case TerminateCancelling():
            return d.terminate_cancelling(command)
        case DeliverCancel():
            return d.deliver_cancel(command)
        case RevokeAttempt():
            return d.revoke_attempt(command)
        case RetryTask():
            return d.retry(command)
    raise TypeError(f"unknown command {command!r}")  # pragma: no cover


def _create(c: CreateTask, now: datetime, actor: str) -> TaskCreated:
    if not 1 <= c.max_attempts <= 100:
        raise InvalidRequest("max_attempts must be between 1 and 100")
    if not 1 <= c.lease_seconds <= 3600:
        raise InvalidRequest("lease_seconds must be between 1 and 3600")
    if not 1 <= c.execution_timeout_seconds <= 604800:
        raise InvalidRequest("execution_timeout_seconds must be between 1 and 604800")
    if not c.task_type:
        raise InvalidRequest("task_type must not be empty")
    paged = c.scope if isinstance(c.scope, PagedScope) else page_scope(c.scope)
    if paged.stored and not isinstance(c.scope, PagedScope):
        raise ValueError("a scope of more than one page is paged (and its pages stored) by the caller")
    # A task that could not be handed to a worker (its lease answer would not encode) is refused
    # here, whichever way it is created: the scope's inline part, which every answer carries (the
    # stored pages hold assets from clients, checked where they entered, or from the orchestrator,
    # kind and value strings). The size limits apply where a request enters, never to what the
    # Gateway derives.
    check_field("scope", paged.inline, max_bytes=None)
    check_field("parameters", c.parameters, max_bytes=None)
    ref = paged.ref
    # A scope whole inline, with nothing left out, needs no reference (and the event stays as
    # it always was); one with stored pages, or assets left out, records it.
    whole = {} if not (paged.stored or ref.omitted) else {
        "scope_sha256": ref.sha256, "scope_bytes": ref.size, "scope_assets": ref.assets,
        "scope_pages": paged.page_hashes, "scope_assets_omitted": ref.omitted}
    return TaskCreated(
        originator_id=c.task_id, originator_version=1, timestamp=now, actor=actor,
        scan_id=c.scan_id, scan_job_id=c.scan_job_id, organization_id=c.organization_id,
        task_type=c.task_type, required_capabilities=tuple(sorted(set(c.required_capabilities))),
        priority=c.priority, scope=paged.inline, parameters=c.parameters, max_attempts=c.max_attempts,
        lease_seconds=c.lease_seconds, execution_timeout_seconds=c.execution_timeout_seconds,
        available_at=c.available_at or now, **whole,
    )


class _Decider:
    """Decisions on one task at one moment; each method handles one command."""

    def __init__(self, task: TaskState, now: datetime, actor: str, draw: float, policy: RetryPolicy):
        self.task, self.now, self.actor, self.draw, self.policy = task, now, actor, draw, policy
        self._version = task.version

    def _event(self, cls: type[DomainEvent], **facts: Any) -> DomainEvent:
        self._version += 1
        return cls(originator_id=self.task.id, originator_version=self._version, timestamp=self.now,
                   actor=self.actor, **facts)

    def _reject(self, command: str, attempt_id: UUID, reason: str) -> list[DomainEvent]:
        return [self._event(WriteRejected, command=command, attempt_id=attempt_id, reason=reason)]

    def _fence(self, write: WorkerWrite, *, allow_cancelling: bool = False) -> str | None:
        """The reason this write must be refused, or None when the attempt holds a live lease."""
        task, attempt = self.task, write.attempt
        if write.lease_token_hash != attempt.lease_token_hash:
            return "bad_token"
        current = task.current_attempt
        if current is None or current.id != attempt.id:
            return "superseded"
        if task.state == "cancelled" or (task.state == "cancelling" and not allow_cancelling):
            return "cancelled"
        if not current.live:
            return _ENDED_ATTEMPT_REASONS.get(current.status, "finished")
        if _timed_out(current, self.now):
            return "deadline_passed"
        if current.lease_expires_at <= self.now:
            return "lease_expired"
        return None

    def _is_current(self, write: WorkerWrite) -> bool:
        current = self.task.current_attempt
        return (current is not None and current.id == write.attempt.id
                and write.lease_token_hash == current.lease_token_hash)

    def _retry_or_terminal(self) -> tuple[str, datetime | None]:
        if self.task.attempt_count < self.task.max_attempts:
            delay = self.policy.delay(max(self.task.attempt_count, 1), self.draw)
            return "retry_wait", self.now + delay
        return "failed_terminal", None

    # acquisition -------------------------------------------------------------------------

    def lease(self, c: GrantLease) -> list[DomainEvent]:
        task, w = self.task, c.worker
        if task.state not in ACQUIRABLE_STATES:
            raise InvalidTransition(f"a {task.state} task cannot be leased")
        if task.available_at > self.now:
            raise InvalidTransition("the task is not available yet")
        if task.attempt_count >= task.max_attempts:
            raise InvalidTransition("the task has no attempts left")
        if not w.enabled or w.revoked:
            raise InvalidTransition("the worker may not lease tasks")
        if w.live_attempts >= w.max_concurrent_tasks:
            raise InvalidTransition("the worker is at capacity")
        if task.task_type not in w.task_types or not set(task.required_capabilities) <= w.capabilities:
            raise InvalidTransition("the worker cannot run this task")
        deadline = self.now + timedelta(seconds=task.execution_timeout_seconds)
        expires = min(self.now + timedelta(seconds=task.lease_seconds), deadline)
        return [self._event(
            TaskLeased, scan_id=task.scan_id, scan_job_id=task.scan_job_id, attempt_id=c.attempt_id,
            worker_id=w.id, attempt_number=task.attempt_count + 1, lease_token_hash=c.lease_token_hash,
            lease_expires_at=expires, deadline_at=deadline, request_id=c.request_id, fair_share=c.fair_share,
        )]

    def reissue(self, c: ReissueLease) -> list[DomainEvent]:
        current = self.task.current_attempt
        if (current is None or current.id != c.attempt_id or not current.live
                or self.task.state not in ("leased", "running") or current.lease_expires_at <= self.now):
            raise LeaseLost("the lease this acquire request created has ended; send a new request_id")
        return [self._event(LeaseReissued, attempt_id=c.attempt_id, lease_token_hash=c.lease_token_hash)]

    # worker writes -----------------------------------------------------------------------

    def mark_running(self, c: MarkRunning) -> list[DomainEvent]:
        if self.task.state == "running" and self._is_current(c) and self._fence(c) is None:
            return []  # repeated progress is idempotent
        if (reason := self._fence(c)) is not None:
            return self._reject("progress", c.attempt.id, reason)
        if self.task.state == "leased":
            return [self._event(TaskStarted, attempt_id=c.attempt.id)]
        return []

    def renew(self, c: Renew) -> list[DomainEvent]:
        if (reason := self._fence(c, allow_cancelling=True)) is not None:
            return self._reject("renew", c.attempt.id, reason)
        if self.task.state == "cancelling":
            # Not extended: the answer carries cancel_requested and the worker stops.
            return self.deliver_cancel(DeliverCancel(c.attempt.id, "renew"))
        current = self.task.current_attempt
        assert current is not None
        expires = min(self.now + timedelta(seconds=self.task.lease_seconds), current.deadline_at)
        return [self._event(LeaseRenewed, attempt_id=c.attempt.id, lease_expires_at=expires)]

    def submit_batch(self, c: SubmitBatch) -> list[DomainEvent]:
        if not c.idempotency_key or len(c.idempotency_key) > 200:
            raise InvalidRequest("idempotency_key must be 1..200 characters")
        if c.sequence_number < 1 or c.record_count < 0:
            raise InvalidRequest("sequence_number starts at 1; record_count cannot be negative")
        if c.existing is not None:
            same_attempt = (c.existing.attempt_id == c.attempt.id
                            and c.lease_token_hash == c.attempt.lease_token_hash)
            if same_attempt and c.existing.payload_sha256 == c.payload_sha256:
                return []  # a retry of an accepted batch: the original acknowledgement stands
            return self._reject("results", c.attempt.id, "idempotency_conflict")
        if (reason := self._fence(c)) is not None:
            return self._reject("results", c.attempt.id, reason)
        current = self.task.current_attempt
        assert current is not None
        if current.final_batch_accepted:
            return self._reject("results", c.attempt.id, "finished")
        if c.sequence_number != current.batch_count + 1:
            return self._reject("results", c.attempt.id, "out_of_order")
        events: list[DomainEvent] = []
        if self.task.state == "leased":
            events.append(self._event(TaskStarted, attempt_id=c.attempt.id))
        events.append(self._event(
            ResultBatchAccepted, attempt_id=c.attempt.id, batch_id=c.batch_id,
            sequence_number=c.sequence_number, idempotency_key=c.idempotency_key,
            payload_sha256=c.payload_sha256, record_count=c.record_count, final=c.final,
        ))
        return events

    def complete(self, c: Complete) -> list[DomainEvent]:
        if self.task.state == "completed" and self._is_current(c):
            return []  # repeated completion returns the completed task
        if (reason := self._fence(c)) is not None:
            return self._reject("complete", c.attempt.id, reason)
        current = self.task.current_attempt
        assert current is not None
        if not current.final_batch_accepted:
            return self._reject("complete", c.attempt.id, "final_missing")
        return [self._event(TaskCompleted, scan_job_id=self.task.scan_job_id, attempt_id=c.attempt.id)]

    def fail(self, c: Fail) -> list[DomainEvent]:
        current = self.task.current_attempt
        if self._is_current(c) and current is not None and current.status == "failed":
            return []  # repeated failure returns the current state
        if (reason := self._fence(c)) is not None:
            return self._reject("fail", c.attempt.id, reason)
        if c.retryable:
            outcome, available_at = self._retry_or_terminal()
        else:
            outcome, available_at = "failed_terminal", None
        return [self._event(
            AttemptFailed, scan_job_id=self.task.scan_job_id, attempt_id=c.attempt.id,
            error=c.error[-4000:], retryable=c.retryable, reason="worker", outcome=outcome,
            available_at=available_at, job_status="failed" if outcome == "failed_terminal" else None,
        )]

    def acknowledge_cancel(self, c: AcknowledgeCancel) -> list[DomainEvent]:
        if self.task.state == "cancelled" and self._is_current(c):
            return []  # repeated acknowledgement is a no-op
        if self.task.state != "cancelling":
            if (reason := self._fence(c)) is not None:
                return self._reject("cancel-ack", c.attempt.id, reason)
            raise InvalidTransition("no cancellation was requested for this task")
        if (reason := self._fence(c, allow_cancelling=True)) not in (None, "lease_expired", "deadline_passed"):
            return self._reject("cancel-ack", c.attempt.id, reason or "")
        return [self._event(TaskCancelled, scan_job_id=self.task.scan_job_id, attempt_id=c.attempt.id,
                            reason=ACKNOWLEDGED_BY_WORKER)]

    # gateway-side transitions ------------------------------------------------------------

    def _live_attempt(self, attempt_id: UUID) -> AttemptState | None:
        current = self.task.current_attempt
        if current is None or current.id != attempt_id or not current.live:
            return None
        return current

    def expire_lease(self, c: ExpireLease) -> list[DomainEvent]:
        current = self._live_attempt(c.attempt_id)
        if current is None or current.lease_expires_at > self.now:
            return []  # renewed or finished meanwhile: nothing to expire
        return self._end_lapsed(current)

    def exceed_deadline(self, c: ExceedDeadline) -> list[DomainEvent]:
        current = self._live_attempt(c.attempt_id)
        if current is None or current.deadline_at > self.now:
            return []
        return self._end_lapsed(current)

    def _end_lapsed(self, current: AttemptState) -> list[DomainEvent]:
        """End a live attempt whose lease or deadline has passed, by whichever came first.

        An attempt that still held its lease when its deadline arrived timed out (a policy
        limit: terminal, job ``timeout``); one whose lease ran out first was lost (the recovery
        path: retry if attempts remain). The time of the sweep does not change which it was.
        """
        timed_out = _timed_out(current, self.now)
        if self.task.state == "cancelling":
            reason = "execution deadline passed while cancelling" if timed_out else "lease expired while cancelling"
            return [self._event(TaskCancelled, scan_job_id=self.task.scan_job_id, attempt_id=current.id,
                                reason=reason)]
        if timed_out:
            return [self._event(AttemptTimedOut, scan_job_id=self.task.scan_job_id, attempt_id=current.id,
                                deadline_at=current.deadline_at)]
        outcome, available_at = self._retry_or_terminal()
        return [self._event(LeaseExpired, scan_job_id=self.task.scan_job_id, attempt_id=current.id,
                            outcome=outcome, available_at=available_at)]

    def request_cancel(self, c: RequestCancel) -> list[DomainEvent]:
        state = self.task.state
        if state in ACQUIRABLE_STATES:
            return [self._event(TaskCancelled, scan_job_id=self.task.scan_job_id, attempt_id=None,
                                reason=c.reason)]
        if state in ("leased", "running"):
            return [self._event(CancelRequested, reason=c.reason)]
        return []  # cancelling, or already finished: repeated cancel is a no-op

    def deliver_cancel(self, c: DeliverCancel) -> list[DomainEvent]:
        """Only the first delivery of the cancellation to the attempt it concerns is recorded."""
        if self.task.state != "cancelling" or self.task.cancel_delivered_at is not None:
            return []
        if self._live_attempt(c.attempt_id) is None:
            return []
        return [self._event(CancelDelivered, attempt_id=c.attempt_id, channel=c.channel)]

    def revoke_attempt(self, c: RevokeAttempt) -> list[DomainEvent]:
        """End the attempt at once. A cancellation already requested ends as ``cancelled`` (its
        worker can no longer acknowledge it); otherwise the task is free for another worker now,
        without backoff (the attempt did not fail), if it has attempts left."""
        current = self._live_attempt(c.attempt_id)
        if current is None:
            return []  # finished, expired or superseded meanwhile
        if self.task.state == "cancelling":
            return [self._event(TaskCancelled, scan_job_id=self.task.scan_job_id, attempt_id=current.id,
                                reason=c.reason)]
        if self.task.state not in ("leased", "running"):
            return []
        remaining = self.task.attempt_count < self.task.max_attempts
        return [self._event(AttemptRevoked, scan_job_id=self.task.scan_job_id, attempt_id=current.id,
                            reason=c.reason, outcome="retry_wait" if remaining else "failed_terminal",
                            available_at=self.now if remaining else None)]

    def terminate_cancelling(self, c: TerminateCancelling) -> list[DomainEvent]:
        requested = self.task.cancel_requested_at
        if self.task.state != "cancelling" or requested is None or requested + c.grace > self.now:
            return []
        current = self.task.current_attempt
        return [self._event(TaskCancelled, scan_job_id=self.task.scan_job_id,
                            attempt_id=current.id if current is not None and current.live else None,
                            reason=NOT_ACKNOWLEDGED)]

    def retry(self, c: RetryTask) -> list[DomainEvent]:
        task = self.task
        if task.state != "failed_terminal":
            raise InvalidTransition(f"only a failed_terminal task can be retried; this one is {task.state}",
                                    state=task.state)
        fresh = task.max_attempts if c.attempts is None else c.attempts
        if fresh < 1:
            raise InvalidRequest("attempts must be at least 1")
        if task.attempt_count + fresh > MAX_ATTEMPTS:
            raise InvalidTransition(
                f"the task has made {task.attempt_count} attempts; {fresh} more would exceed "
                f"{MAX_ATTEMPTS} in all", attempt_count=task.attempt_count)
        return [self._event(TaskRetried, scan_job_id=task.scan_job_id, reason=c.reason,
                            max_attempts=task.attempt_count + fresh)]


def _timed_out(attempt: AttemptState, now: datetime) -> bool:
    """The attempt reached its execution deadline while still holding its lease (leases are
    capped at the deadline, so a lease renewed on time runs exactly up to it)."""
    return attempt.deadline_at <= now and attempt.deadline_at <= attempt.lease_expires_at


# Why a write on an attempt that has already ended is refused, by how it ended.
_ENDED_ATTEMPT_REASONS: dict[str, str] = {"expired": "lease_expired", "timeout": "deadline_passed"}

_REJECTION_ERRORS: dict[str, type[LeaseholdError]] = {
    "superseded": LeaseLost, "bad_token": LeaseLost, "lease_expired": LeaseLost, "finished": LeaseLost,
    "cancelled": TaskWasCancelled, "deadline_passed": DeadlineExceeded,
    "idempotency_conflict": IdempotencyConflict, "not_started": InvalidTransition,
    "final_missing": InvalidTransition, "out_of_order": InvalidTransition,
}

_REJECTION_MESSAGES: dict[str, str] = {
    "superseded": "this attempt was superseded by a newer one",
    "bad_token": "the lease token does not match this attempt",
    "lease_expired": "the lease of this attempt has expired",
    "finished": "this attempt has already finished",
    "cancelled": "the task has been cancelled",
    "deadline_passed": "the task's execution deadline has passed",
    "idempotency_conflict": "this idempotency key was already used with a different payload",
    "not_started": "the attempt has not started",
    "final_missing": "complete requires an accepted final result batch",
    "out_of_order": "result batches must be submitted in sequence",
}


def rejection_error(event: WriteRejected) -> LeaseholdError:
    """The error a recorded rejection answers the worker with."""
    return _refusal(event.reason, event.attempt_id)


def _refusal(reason: str, attempt_id: UUID) -> LeaseholdError:
    cls = _REJECTION_ERRORS[reason]
    return cls(_REJECTION_MESSAGES[reason], reason=reason, attempt_id=str(attempt_id))


def read_refusal(task: TaskState, attempt: AttemptState, lease_token_hash: str, *,
                 now: datetime) -> LeaseholdError | None:
    """Why the worker holding ``attempt`` may not read what the attempt needs from the Gateway
    (the pages of its task's scope) at ``now``, as the error to answer with; None when it may.

    The fencing of worker writes: the token must be the attempt's, the attempt the task's live
    one, its lease and deadline not passed, the task not cancelled. Unlike a refused write, a
    refused read is not recorded: it changes nothing.
    """
    reason = _Decider(task, now, "", 0.5, DEFAULT_RETRY_POLICY)._fence(WorkerWrite(attempt, lease_token_hash))
    return None if reason is None else _refusal(reason, attempt.id)


# --- evolve ---------------------------------------------------------------------------------


@singledispatch
def evolve(event: DomainEvent, task: TaskState | None) -> TaskState:
    """Fold one task-stream event into the task state."""
    raise TypeError(f"{type(event).__name__} is not a task event")


@evolve.register
def _(e: TaskCreated, task: TaskState | None) -> TaskState:
    return TaskState(
        id=e.originator_id, version=e.originator_version, scan_id=e.scan_id, scan_job_id=e.scan_job_id,
        organization_id=e.organization_id, task_type=e.task_type,
        required_capabilities=tuple(e.required_capabilities), priority=e.priority, scope=e.scope,
        parameters=e.parameters, state="pending", available_at=e.available_at, attempt_count=0,
        max_attempts=e.max_attempts, lease_seconds=e.lease_seconds,
        execution_timeout_seconds=e.execution_timeout_seconds, created_at=e.timestamp,
        updated_at=e.timestamp, scope_ref=scope_ref_of(e),
    )


def scope_ref_of(e: TaskCreated) -> ScopeRef | None:
    """The scope reference a ``TaskCreated`` records (None: its ``scope`` is the whole scope)."""
    if e.scope_sha256 is None or e.scope_bytes is None:
        return None
    pages = 0 if e.scope_assets is None else 1 + len(e.scope_pages)
    return ScopeRef(e.scope_sha256, e.scope_bytes, e.scope_assets, pages, e.scope_assets_omitted)


def _step(task: TaskState | None, e: DomainEvent, **changes: Any) -> TaskState:
    assert task is not None, f"{type(e).__name__} before TaskCreated"
    return replace(task, version=e.originator_version, updated_at=e.timestamp, **changes)


def _attempt(task: TaskState, **changes: Any) -> AttemptState:
    assert task.current_attempt is not None
    return replace(task.current_attempt, **changes)


@evolve.register
def _(e: TaskLeased, task: TaskState | None) -> TaskState:
    assert task is not None
    attempt = AttemptState(
        id=e.attempt_id, task_id=task.id, worker_id=e.worker_id, attempt_number=e.attempt_number,
        lease_token_hash=e.lease_token_hash, status="leased", leased_at=e.timestamp,
        lease_expires_at=e.lease_expires_at, deadline_at=e.deadline_at,
    )
    return _step(task, e, state="leased", attempt_count=e.attempt_number, current_attempt=attempt)


@evolve.register
def _(e: LeaseReissued, task: TaskState | None) -> TaskState:
    assert task is not None
    return _step(task, e, current_attempt=_attempt(task, lease_token_hash=e.lease_token_hash))


@evolve.register
def _(e: TaskStarted, task: TaskState | None) -> TaskState:
    assert task is not None
    return _step(task, e, state="running", current_attempt=_attempt(task, status="running",
                                                                     started_at=e.timestamp))


@evolve.register
def _(e: LeaseRenewed, task: TaskState | None) -> TaskState:
    assert task is not None
    return _step(task, e, current_attempt=_attempt(task, lease_expires_at=e.lease_expires_at))


@evolve.register
def _(e: ResultBatchAccepted, task: TaskState | None) -> TaskState:
    assert task is not None and task.current_attempt is not None
    attempt = _attempt(task, batch_count=e.sequence_number,
                       final_batch_accepted=task.current_attempt.final_batch_accepted or e.final)
    return _step(task, e, current_attempt=attempt)


@evolve.register
def _(e: TaskCompleted, task: TaskState | None) -> TaskState:
    assert task is not None
    return _step(task, e, state="completed", finished_at=e.timestamp,
                 current_attempt=_attempt(task, status="succeeded", finished_at=e.timestamp))


@evolve.register
def _(e: AttemptFailed, task: TaskState | None) -> TaskState:
    assert task is not None
    terminal = e.outcome == "failed_terminal"
    return _step(task, e, state=e.outcome, last_error=e.error,
                 available_at=e.available_at or task.available_at,
                 finished_at=e.timestamp if terminal else None,
                 current_attempt=_attempt(task, status="failed", finished_at=e.timestamp, error=e.error))


@evolve.register
def _(e: LeaseExpired, task: TaskState | None) -> TaskState:
    assert task is not None
    terminal = e.outcome == "failed_terminal"
    return _step(task, e, state=e.outcome, last_error="lease expired",
                 available_at=e.available_at or task.available_at,
                 finished_at=e.timestamp if terminal else None,
                 current_attempt=_attempt(task, status="expired", finished_at=e.timestamp,
                                          error="lease expired"))


@evolve.register
def _(e: AttemptTimedOut, task: TaskState | None) -> TaskState:
    assert task is not None
    return _step(task, e, state="failed_terminal", last_error=TIMEOUT_ERROR, finished_at=e.timestamp,
                 current_attempt=_attempt(task, status="timeout", finished_at=e.timestamp, error=TIMEOUT_ERROR))


@evolve.register
def _(e: CancelRequested, task: TaskState | None) -> TaskState:
    assert task is not None
    return _step(task, e, state="cancelling", cancel_requested_at=e.timestamp)


@evolve.register
def _(e: CancelDelivered, task: TaskState | None) -> TaskState:
    assert task is not None
    return _step(task, e, cancel_delivered_at=e.timestamp, cancel_delivery_channel=e.channel)


@evolve.register
def _(e: AttemptRevoked, task: TaskState | None) -> TaskState:
    assert task is not None
    terminal = e.outcome == "failed_terminal"
    return _step(task, e, state=e.outcome, last_error=e.reason,
                 available_at=e.available_at or task.available_at,
                 finished_at=e.timestamp if terminal else None,
                 current_attempt=_attempt(task, status="cancelled", finished_at=e.timestamp, error=e.reason))


@evolve.register
def _(e: TaskCancelled, task: TaskState | None) -> TaskState:
    assert task is not None
    attempt = task.current_attempt
    if e.attempt_id is not None and attempt is not None and attempt.id == e.attempt_id:
        attempt = replace(attempt, status="cancelled", finished_at=e.timestamp)
    return _step(task, e, state="cancelled", finished_at=e.timestamp,
                 cancel_requested_at=task.cancel_requested_at or e.timestamp, current_attempt=attempt)


@evolve.register
def _(e: TaskRetried, task: TaskState | None) -> TaskState:
    assert task is not None
    return _step(task, e, state="pending", available_at=e.timestamp, max_attempts=e.max_attempts,
                 finished_at=None)


@evolve.register
def _(e: WriteRejected, task: TaskState | None) -> TaskState:
    assert task is not None
    return replace(task, version=e.originator_version)


def project_task(events: Iterable[DomainEvent], task: TaskState | None = None) -> TaskState | None:
    """Fold a task's events (from ``task``, or from nothing) into its state."""
    for event in events:
        task = evolve(event, task)
    return task
