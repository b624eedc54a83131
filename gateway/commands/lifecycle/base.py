"""The task lifecycle's shared part: what every command returns, the service's state and the
tail every command ends with (decide, append, settle the scan, commit)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from leasehold.domain import fairness
from leasehold.domain import scan as scan_rules
from leasehold.domain.errors import Forbidden, InvalidTransition, NotFound
from leasehold.domain.events import (
    CancelDelivered,
    DomainEvent,
    TaskCancelled,
)
from leasehold.domain.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from leasehold.domain.targets import check_scope, policy_from_json, targets_of
from leasehold.domain.task import (
    ACKNOWLEDGED_BY_WORKER,
    NOT_ACKNOWLEDGED,
    AttemptState,
    BatchRecord,
    CreateTask,
    TaskState,
    WorkerWrite,
    decide,
    project_task,
)
from leasehold.gateway.commands import admission, wakeups, webhooks
from leasehold.gateway.commands.idempotency import IdempotencyKey, claim
from leasehold.gateway.commands.idempotency import created as created_by
from leasehold.gateway.commands.scans import settle_scan
from leasehold.gateway.commands.scopes import paged
from leasehold.persistence.event_log import StreamHead
from leasehold.persistence.task_rows import (
    caller_standing,
    task_from_row,
)
from leasehold.persistence.transaction import Clock, Database, Transaction, one, system_clock
from leasehold.protocol.targets import resolve_names

TERMINAL = frozenset({"completed", "failed_terminal", "cancelled"})
#: How many refused writes of one attempt are recorded as ``WriteRejected`` events; the rest are
#: only counted, in ``rejected_write_counts``.
MAX_RECORDED_REJECTIONS = 20


def hash_token(token: str) -> str:
    """Hex sha256 of a lease token; only this ever reaches the database or the log."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Acquired:
    """A fresh lease: the only time the plaintext ``lease_token`` is ever returned."""

    task: TaskState
    attempt: AttemptState
    lease_token: str
    #: The organisation's target policy as stored (``{"allow": [...], "deny": [...]}``; None: default).
    target_policy: dict[str, Any] | None = None


#: What an acquire answer tells a worker registered without task types (it is never offered a task).
NO_TASK_TYPES = "this worker is registered without task types: it is never offered a task"

def lease_request_ids(request_id: str, count: int) -> list[str]:
    """The request ids the leases of one acquire are stored under: the first lease under
    ``request_id`` itself (as a one-task acquire), the n-th under ``request_id#n``."""
    return [request_id, *(f"{request_id}#{n}" for n in range(2, count + 1))]


@dataclass(frozen=True, slots=True)
class Poll:
    """What one acquire round found: a lease (or None), the worker's attempts to stop
    (``undelivered``: those whose cancellation was never handed to the worker yet), and why the
    worker can get no work at all, if that is so (:data:`NO_TASK_TYPES`)."""

    acquired: Acquired | None
    cancel_requested: list[tuple[UUID, UUID]]
    undelivered: frozenset[UUID] = frozenset()
    warning: str | None = None
    #: The worker's organisations and task types as this poll saw them (what decides which
    #: notifications concern its long-poll while it waits, :mod:`gateway.background.waitroom`).
    organizations: frozenset[UUID] = frozenset()
    task_types: frozenset[str] = frozenset()
    #: Every lease this round granted (``acquired`` is the first), in the order granted.
    leases: tuple[Acquired, ...] = ()


#: Why a task stored before the input limits, whose scope or parameters break them, was cancelled
#: (migration 0022 lists them, :mod:`.undeliverable` ends them): its lease answer might not be
#: encodable, so it could never be relied on to reach a worker.
UNDELIVERABLE = "undeliverable: the task's lease answer cannot be encoded"


#: How a cancellation leg is observed: (leg, channel, seconds); legs are ``request_to_delivery``
#: and ``delivery_to_ack``.
CancelLegObserver = Callable[[str, str, float], None]


def cancel_legs(task: TaskState, events: Sequence[DomainEvent]) -> list[tuple[str, str, float]]:
    """The cancellation legs ``events`` (appended to ``task``) complete: the first delivery
    after the request, and the worker's acknowledgement after the delivery."""
    legs: list[tuple[str, str, float]] = []
    channel: str = task.cancel_delivery_channel or ""
    delivered_at = task.cancel_delivered_at
    for event in events:
        if isinstance(event, CancelDelivered) and task.cancel_requested_at is not None:
            channel, delivered_at = event.channel, event.timestamp
            legs.append(("request_to_delivery", channel,
                         (event.timestamp - task.cancel_requested_at).total_seconds()))
        elif isinstance(event, TaskCancelled) and event.reason == ACKNOWLEDGED_BY_WORKER and delivered_at:
            legs.append(("delivery_to_ack", channel, (event.timestamp - delivered_at).total_seconds()))
    return legs


@dataclass(frozen=True, slots=True)
class Renewed:
    task: TaskState
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class BatchReceipt:
    """The acknowledgement of an accepted batch (the original one when a retry repeats it)."""

    batch: BatchRecord
    task: TaskState
    duplicate: bool


@dataclass(frozen=True, slots=True)
class ResultBatch:
    """A batch of result records as a worker submits it (its sha256 is checked on arrival)."""

    sequence_number: int
    idempotency_key: str
    payload_sha256: str
    records: list[Any]
    final: bool = True


#: Builds a worker's write command from its attempt (as the state stands when it is decided), the
#: hash of the token it presented, and the batch already stored under its idempotency key.
WriteMaker = Callable[[AttemptState, str, BatchRecord | None], WorkerWrite]


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """What a scan job's task needs (the scan supplies organisation and job)."""

    task_type: str
    required_capabilities: tuple[str, ...] = ()
    priority: int = 0
    scope: dict[str, Any] | None = None
    parameters: dict[str, Any] | None = None
    max_attempts: int = 3
    lease_seconds: int = 60
    execution_timeout_seconds: int = 3600
    plugin: str | None = None


class LifecycleBase:
    """State and shared steps of :class:`gateway.commands.lifecycle.Lifecycle`."""

    def __init__(self, db: Database, *, clock: Clock = system_clock,
                 rng: random.Random | None = None, retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY,
                 cancel_grace: timedelta = timedelta(seconds=30),
                 new_id: Callable[[], UUID] = uuid4, fair_shares: bool = True) -> None:
        self.db = db
        #: Fair shares between a worker's organisations at equal priority (domain.fairness);
        #: off: the oldest task of any organisation first. Caps hold either way.
        self.fair_shares = fair_shares
        self.clock = clock
        self.rng = rng or random.Random()
        self.retry_policy = retry_policy
        self.cancel_grace = cancel_grace
        self.new_id = new_id
        #: Called with the events of every committed command (metrics hook).
        self.observe: Callable[[Sequence[DomainEvent]], None] = lambda events: None
        #: Called with each cancellation leg a committed command completed (metrics hook).
        self.observe_cancel: CancelLegObserver = lambda leg, channel, seconds: None

    async def create_task(self, scan_id: UUID, spec: TaskSpec, *, actor: str = "system",
                          idempotency: IdempotencyKey | None = None) -> TaskState:
        """Queue a job on the scan and create its task (one transaction, scan row locked). The
        scope's targets must pass the organisation's target policy (:mod:`domain.targets`). With
        ``idempotency``, a request already made with that key creates nothing and raises
        :class:`~gateway.commands.idempotency.AlreadyCreated` with its task's id."""
        job_id, task_id = self.new_id(), self.new_id()
        resolved = await resolve_names(spec.scope)  # before the transaction: no lock waits on DNS

        async def body(tx: Transaction) -> list[DomainEvent]:
            await claim(tx, idempotency, self.clock())
            created_by(tx, idempotency, task_id)
            params = {"scan_id": scan_id, "now": self.clock()}
            reads = [one("scan_lock", params), one("scan_next_job_position", params),
                     one("scan_organization_admission", params)]
            if targets_of(spec.scope):  # the policy only matters when the scope names targets
                reads.append(one("scan_organization_target_policy", params))
            row, position, caps, *policy = await tx.read(*reads)
            if row is None:
                raise NotFound("no such scan", scan_id=str(scan_id))
            version, head_hash, org_id, status = row.version, row.head_hash, row.organization_id, row.status
            next_position, now = position.next_position, position.now
            for found in policy:
                check_scope(policy_from_json(found.target_policy), spec.scope, resolved)
            if row.execution_mode != "gateway":
                raise InvalidTransition("the Gateway never creates tasks for legacy-executed scans")
            if row.has_profile:
                raise InvalidTransition("a profile scan's tasks are created by its profile")
            await admission.admit(tx, "task", org_id, caps.max_queued_tasks)
            queued = scan_rules.queue_job(
                scan_id, version, status, organization_id=org_id, job_id=job_id, position=next_position,
                plugin=spec.plugin or spec.task_type, execution_mode="gateway", now=now, actor=actor)
            created = decide(None, CreateTask(
                task_id=task_id, scan_id=scan_id, scan_job_id=job_id, organization_id=org_id,
                task_type=spec.task_type, required_capabilities=spec.required_capabilities,
                priority=spec.priority, scope=paged(tx, spec.scope or {}), parameters=spec.parameters or {},
                max_attempts=spec.max_attempts, lease_seconds=spec.lease_seconds,
                execution_timeout_seconds=spec.execution_timeout_seconds), now=now, actor=actor)
            tx.append(StreamHead(scan_id, version, bytes(head_hash)), [queued])
            tx.append(StreamHead(task_id), created)
            tx.notify(wakeups.available(org_id))
            return [queued, *created]

        events = await self.db.run(body)
        self.observe(events)
        _queued, *created = events  # the scan's JobQueued, then the task's own
        task = project_task(created)
        assert task is not None
        return task

    def _observe_legs(self, task: TaskState, events: Sequence[DomainEvent]) -> None:
        for leg, channel, seconds in cancel_legs(task, events):
            self.observe_cancel(leg, channel, seconds)

    async def _gateway_command(self, task_id: UUID, command: Any, actor: str) -> TaskState:
        task, events = await self.db.run(lambda tx: self._decide_locked(tx, task_id, command, actor))
        self.observe(events)
        return task

    async def _decide_locked(self, tx: Transaction, task_id: UUID, command: Any,
                             actor: str) -> tuple[TaskState, list[DomainEvent]]:
        """Lock the task, decide ``command``, append; inside the caller's transaction. The task
        after, and every event appended (the scan's too, when the task ended)."""
        row = await _lock_task_and_read(tx, "task_read", {"task_id": task_id, "now": self.clock()})
        if row is None:
            raise NotFound("no such task", task_id=str(task_id))
        task, head = task_from_row(row)
        now: datetime = row.now
        events = decide(task, command, now=now, actor=actor, draw=self.rng.random(),
                        retry_policy=self.retry_policy)
        after, settled = await self._commit(tx, task, head, events, now)
        return after, [*events, *settled]

    async def _commit(self, tx: Transaction, task: TaskState, head: StreamHead,
                      events: Sequence[DomainEvent], now: datetime, releases: dict[UUID, int] | None = None,
                      appended: Callable[[], Awaitable[None]] | None = None,
                      ) -> tuple[TaskState, list[DomainEvent]]:
        """Append ``events`` to the task, run ``appended`` (the ingestion of a batch they accept),
        and, if the task just ended, settle its scan; the new state, and the events settling
        appended. An attempt that ended stops counting against its organisation's cap: at once,
        or added to ``releases`` for the caller to send."""
        after = project_task(events, task)
        assert after is not None
        tx.append(head, events)
        if appended is not None:
            # Before settling: the next profile step's scope is made of the assets ingested so
            # far, the final batch's included when it travelled with the completion.
            await appended()
        ended = attempts_ended(events)
        if ended and releases is None:
            release_attempts(tx, {task.organization_id: ended}, now)
        elif ended and releases is not None:
            releases[task.organization_id] = releases.get(task.organization_id, 0) + ended
        if after.state == "cancelling" and task.state != "cancelling" and after.current_attempt is not None:
            tx.notify(wakeups.cancel(after.current_attempt.worker_id))
        if after.state == "retry_wait" and task.state != "retry_wait" and after.available_at <= now:
            tx.notify(wakeups.available(after.organization_id))  # free again right now (a revoked attempt)
        notify_webhooks(tx, task, after, events, now)
        settled: list[DomainEvent] = []
        if after.state in TERMINAL and task.state not in TERMINAL:
            settled = await settle_scan(tx, after.scan_id, now, new_id=self.new_id)
        return after, settled


def notify_webhooks(tx: Transaction, task: TaskState, after: TaskState, events: Sequence[DomainEvent],
                    now: datetime) -> None:
    """The webhook notifications a task's change causes, queued in its transaction: the task
    failed terminally, or its cancellation was never acknowledged and the Gateway ended it."""
    if after.state == "failed_terminal" and task.state != "failed_terminal":
        webhooks.notify(tx, after.organization_id, "task.failed", {
            "task_id": str(after.id), "scan_id": str(after.scan_id), "task_type": after.task_type,
            "attempts": after.attempt_count, "error": after.last_error}, now)
    elif any(isinstance(e, TaskCancelled) and e.reason == NOT_ACKNOWLEDGED for e in events):
        webhooks.notify(tx, after.organization_id, "task.cancellation_stuck", {
            "task_id": str(after.id), "scan_id": str(after.scan_id), "task_type": after.task_type,
            "cancel_requested_at": after.cancel_requested_at, "cancel_delivered_at": after.cancel_delivered_at},
            now)


def no_such_attempt(task_id: object, attempt_id: object) -> NotFound:
    """The one 404 of the worker's attempt routes: for a task or attempt that does not exist and
    for one that is not this worker's alike, so that an answer never tells which ids exist."""
    return NotFound("no such task or attempt", task_id=str(task_id), attempt_id=str(attempt_id))


def refuse_after_revocation(standing: tuple[bool, bool] | None, write: str, task: TaskState) -> None:
    """RFC "Lease duration", for every worker write, once the worker or its assignment to the
    task's organisation is revoked (``standing``: (worker revoked, assignment revoked), None when
    the worker does not exist):

    * a renewal is refused, except (assignment revoked only) of a task already ``cancelling``,
      so that the worker hears the cancellation (the lease is not extended then anyway);
    * any other write is refused while the task is still ``leased`` or ``running``: the
      revocation's cancellation has not reached it yet, and nothing the worker sends is taken
      meanwhile. Once the task is ``cancelling`` or over, fencing refuses (and records) what it
      must, and the acknowledgement of the cancellation is taken.
    """
    worker_revoked, assignment_revoked = standing if standing is not None else (True, True)
    if not (worker_revoked or assignment_revoked):
        return
    message = ("this worker has been revoked" if worker_revoked
               else "this worker's assignment to the task's organisation has been revoked")
    if write == "renew":
        if worker_revoked or task.state != "cancelling":
            raise Forbidden(message)
    elif task.state in ("leased", "running"):
        raise Forbidden(message)


async def _lock_for_write(tx: Transaction, params: dict[str, Any],
                          fingerprint: str | None) -> tuple[Any, tuple[bool, bool] | None]:
    """A worker write's locks and reads, pipelined into one round trip: the worker row
    (``FOR SHARE``: see ``worker_lock_for_write``), the caller's certificate when given (checked
    before anything else, see :func:`caller_standing`), the task row, then, each in a statement
    of its own after the locks, the task as ``task_read_for_write`` reads it and the worker's
    standing. (The task row, None when there is no such task; the standing.)"""
    reads = [one("worker_lock_for_write", params), one("task_lock", params), one("task_read_for_write", params),
             one("worker_standing_for_write", params)]
    if fingerprint is not None:
        reads.insert(1, one("worker_by_fingerprint", {"fingerprint": fingerprint}))
    answers = await tx.read(*reads)
    if fingerprint is not None:
        caller_standing(answers.pop(1), params["worker_id"])
    _, locked, row, standing = answers
    return (row if locked is not None else None), standing


_TRIES_WITH_CEILINGS = 3


_MAX_TRIES = 20


class _Refused(Exception):  # a control-flow signal, not an error anyone sees
    """The organisation would not count the lease (cap, or past the next in line)."""

    def __init__(self, organization_id: UUID) -> None:
        super().__init__(str(organization_id))
        self.organization_id = organization_id


def attempts_ended(events: Sequence[DomainEvent]) -> int:
    """How many attempts ``events`` end (:func:`domain.fairness.ends_attempt`)."""
    return sum(1 for e in events if fairness.ends_attempt(e))


def release_attempts(tx: Transaction, ended: dict[UUID, int], now: datetime | None) -> None:
    """Queue the organisations' counters of live attempts down by the attempts that ended, in
    organisation order: two transactions that release several organisations lock their rows in
    the same order and cannot deadlock on them."""
    for organization_id in sorted(ended):
        tx.write("org_service", "org_service_release",
                 {"organization_id": organization_id, "attempts": ended[organization_id], "now": now})


async def _lock_task_and_read(tx: Transaction, read: str, params: dict[str, Any],
                              caller: tuple[str, UUID] | None = None) -> Any:
    """Lock the task row, then read with a second statement (one round trip, pipelined).

    The read runs after the lock is granted, so its snapshot includes everything committed by
    the previous holder of the lock (see the comment on ``task_lock``).
    """
    locked, row = await tx.read(one("task_lock", params), one(read, params))
    return row if locked is not None else None


