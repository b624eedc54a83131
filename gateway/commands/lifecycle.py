"""Task lifecycle commands: create, acquire, worker writes, cancel, and the sweeper's steps.

Each public method is one transaction (see :mod:`persistence.transaction`):

1. lock the task row (``FOR UPDATE``; ``SKIP LOCKED`` when choosing work),
2. decide with :func:`domain.task.decide`,
3. append the events and apply their projections (:meth:`Transaction.append`),
4. when the task reached a terminal state, lock its scan and settle the scan's status
   (:func:`gateway.commands.scans.settle_scan`),
5. commit.

A worker write refused by fencing is still committed, as a ``WriteRejected`` event, and the
matching error is raised after the commit.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from uuid import UUID, uuid4

import orjson

from leasehold.domain import fairness
from leasehold.domain import scan as scan_rules
from leasehold.domain.errors import Forbidden, InvalidRequest, InvalidTransition, NotFound
from leasehold.domain.events import (
    CancelChannel,
    CancelDelivered,
    DomainEvent,
    ResultBatchAccepted,
    TaskCancelled,
    WriteRejected,
)
from leasehold.domain.results import canonical_payload
from leasehold.domain.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from leasehold.domain.targets import check_scope, policy_from_json, targets_of
from leasehold.domain.task import (
    ACKNOWLEDGED_BY_WORKER,
    AcknowledgeCancel,
    AttemptState,
    BatchRecord,
    Complete,
    CreateTask,
    DeliverCancel,
    ExceedDeadline,
    ExpireLease,
    Fail,
    GrantLease,
    MarkRunning,
    ReissueLease,
    Renew,
    RequestCancel,
    RetryTask,
    RevokeAttempt,
    SubmitBatch,
    TaskState,
    TerminateCancelling,
    WorkerView,
    WorkerWrite,
    decide,
    project_task,
    rejection_error,
)
from leasehold.gateway.commands import wakeups
from leasehold.gateway.commands.ingestion import ingest_batch
from leasehold.gateway.commands.scans import settle_scan
from leasehold.gateway.commands.scopes import paged
from leasehold.persistence.event_log import StreamHead
from leasehold.persistence.task_rows import (
    ATTEMPT_COLUMNS,
    TASK_COLUMNS,
    attempt_from_row,
    batch_from_row,
    caller_standing,
    task_from_row,
)
from leasehold.persistence.transaction import Clock, Database, Read, Transaction, one, rows, system_clock
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


@dataclass(frozen=True, slots=True)
class Poll:
    """What one acquire round found: a lease (or None), the worker's attempts to stop
    (``undelivered``: those whose cancellation was never handed to the worker yet), and why the
    worker can get no work at all, if that is so (:data:`NO_TASK_TYPES`)."""

    acquired: Acquired | None
    cancel_requested: list[tuple[UUID, UUID]]
    undelivered: frozenset[UUID] = frozenset()
    warning: str | None = None
    #: The answer as the caller's ``render`` encoded it, inside the transaction (None: no render,
    #: or nothing to say).
    answer: bytes | None = None
    #: The worker's organisations and task types as this poll saw them (what decides which
    #: notifications concern its long-poll while it waits, :mod:`gateway.background.waitroom`).
    organizations: frozenset[UUID] = frozenset()
    task_types: frozenset[str] = frozenset()


#: Encodes a poll's answer for the worker (None: nothing to answer yet). Called inside the acquire
#: transaction, before the lease commits, so a lease whose answer cannot be built never commits.
Render = Callable[[Poll], bytes | None]

#: Why a task whose lease answer cannot be encoded (stored before the input limits existed) is
#: cancelled instead of leased: it could never reach a worker, and would jam every acquire.
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


class Lifecycle:
    """Commands on worker tasks. ``clock`` and ``rng`` are injectable for tests."""

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

    # --- creation -------------------------------------------------------------------------

    async def create_task(self, scan_id: UUID, spec: TaskSpec, *, actor: str = "system") -> TaskState:
        """Queue a job on the scan and create its task (one transaction, scan row locked). The
        scope's targets must pass the organisation's target policy (:mod:`domain.targets`)."""
        job_id, task_id = self.new_id(), self.new_id()
        resolved = await resolve_names(spec.scope)  # before the transaction: no lock waits on DNS

        async def body(tx: Transaction) -> list[DomainEvent]:
            params = {"scan_id": scan_id, "now": self.clock()}
            reads = [one("scan_lock", params), one("scan_next_job_position", params)]
            if targets_of(spec.scope):  # the policy only matters when the scope names targets
                reads.append(one("scan_organization_target_policy", params))
            row, (next_position, now), *policy = await tx.read(*reads)
            if row is None:
                raise NotFound("no such scan", scan_id=str(scan_id))
            _, version, head_hash, org_id, status, mode, _, has_profile = row
            if policy:
                check_scope(policy_from_json(policy[0][0]), spec.scope, resolved)
            if mode != "gateway":
                raise InvalidTransition("the Gateway never creates tasks for legacy-executed scans")
            if has_profile:
                raise InvalidTransition("a profile scan's tasks are created by its profile")
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

        events = await self.db.run(body, key=scan_id)
        self.observe(events)
        task = project_task(events[1:])
        assert task is not None
        return task

    # --- acquisition ----------------------------------------------------------------------

    async def acquire(self, worker_id: UUID, *, request_id: str | None = None,
                      actor: str | None = None, fingerprint: str | None = None) -> Acquired | None:
        """Lease one eligible task to the worker, or None (at capacity, or nothing eligible).

        With a ``request_id``, repeating the call returns the same attempt (with a fresh token,
        since only the token's hash is kept) instead of leasing a second task.
        """
        return (await self.poll(worker_id, request_id=request_id, actor=actor, notices=False,
                                fingerprint=fingerprint)).acquired

    async def poll(self, worker_id: UUID, *, request_id: str | None = None, actor: str | None = None,
                   notices: bool = True, fingerprint: str | None = None, render: Render | None = None) -> Poll:
        """:meth:`acquire`, plus (in the same round trip) the worker's attempts whose task is being
        cancelled — what a long-poll answer must tell the worker.

        With the caller's certificate ``fingerprint`` (the Gateway passes it), the worker's
        standing is checked in this transaction, in the same round trip as the worker lock:
        Forbidden, and nothing done, when the certificate is not ``worker_id``'s or the worker
        is revoked or disabled.

        With ``render``, the answer is encoded in the transaction (``Poll.answer``): an answer
        that cannot be built fails the transaction, so no lease commits without its answer. A
        pending task whose lease cannot be encoded is cancelled as undeliverable instead, and
        the worker is answered as if there were no work.
        """
        actor = actor or f"worker:{worker_id}"
        token = secrets.token_urlsafe(32)
        #: An organisation may refuse this acquire's lease (at its cap, or moved past the next
        #: in line by concurrent leases). The transaction that met a refusal holds that
        #: organisation's row lock, so it is rolled back (it never waits for a second
        #: organisation's row while holding one: no deadlock) and the acquire starts over on a
        #: fresh snapshot, which shows what refused it (committed before the refusal). Should
        #: concurrent leases keep refusing it, the later tries drop the ceilings (the order stays
        #: fair, only the spreading of simultaneous acquirers is given up), and after
        #: _MAX_TRIES the acquire answers that it found nothing (the worker polls again).
        tries = 0

        seen: dict[str, Any] = {}

        def answered(polled: Poll) -> Poll:
            polled = replace(polled, organizations=seen["organizations"], task_types=seen["task_types"])
            return polled if render is None else replace(polled, answer=render(polled))

        async def body(tx: Transaction) -> tuple[Poll, list[DomainEvent]]:
            params = {"worker_id": worker_id, "now": self.clock(), "request_id": request_id,
                      "fingerprint": fingerprint}
            # One round trip: the caller's standing, the worker's row (locked) and live attempts,
            # an earlier lease of this request, the cancels to tell it about.
            reads: dict[str, Read] = {}
            if fingerprint is not None:
                reads["caller"] = one("worker_by_fingerprint", params)
            reads["worker"] = one("worker_lock_for_acquire", params)
            reads["live"] = one("worker_live_attempts", params)
            if request_id is not None:
                reads["earlier"] = one("attempt_by_acquire_request", params)
            if notices:
                reads["cancelling"] = rows("worker_cancelling_attempts", params)
            reads["candidates"] = rows("fair_share_candidates", params)
            reads["organizations"] = rows("worker_organizations", params)
            answers = dict(zip(reads, await tx.read(*reads.values()), strict=True))
            row, earlier = answers["worker"], answers.get("earlier")
            seen["organizations"] = frozenset(o for (o,) in answers["organizations"])
            seen["task_types"] = frozenset(row[5]) if row is not None else frozenset()
            cancelling = [(t, a) for t, a, _ in answers.get("cancelling", ())]
            undelivered = frozenset(a for _, a, delivered in answers.get("cancelling", ()) if not delivered)
            if fingerprint is not None:
                caller_standing(answers["caller"], worker_id)
            if row is None:
                raise NotFound("no such worker", worker_id=str(worker_id))
            live_attempts, now, *_plan_pinned = answers["live"]
            if earlier is not None:
                task, events = await self._decide_locked(tx, earlier[0], ReissueLease(
                    attempt_id=earlier[1], lease_token_hash=hash_token(token)), actor)
                assert task.current_attempt is not None
                (policy,) = await tx.value("organization_target_policy", {"organization_id": task.organization_id})
                return answered(Poll(Acquired(task=task, attempt=task.current_attempt, lease_token=token,
                                              target_policy=policy), cancelling, undelivered)), events
            worker = WorkerView(id=row[0], enabled=row[1], revoked=row[2], max_concurrent_tasks=row[3],
                                capabilities=frozenset(row[4]), task_types=frozenset(row[5]),
                                live_attempts=live_attempts)
            if not worker.task_types:
                return answered(Poll(None, cancelling, undelivered, warning=NO_TASK_TYPES)), []
            if not worker.enabled or worker.revoked or worker.live_attempts >= worker.max_concurrent_tasks:
                return answered(Poll(None, cancelling, undelivered)), []
            candidates = [fairness.Candidate(*r) for r in answers["candidates"]]
            lock_params = {"now": now, "task_types": sorted(worker.task_types),
                           "capabilities": sorted(worker.capabilities)}
            if tries >= _MAX_TRIES:
                return answered(Poll(None, cancelling, undelivered)), []
            for choice in fairness.preference(candidates, fair=self.fair_shares):
                ceiling = choice.ceiling if tries < _TRIES_WITH_CEILINGS else fairness.NO_CEILING
                row = await tx.one("task_lock_for_organization", {
                    **lock_params, "organization_id": choice.candidate.organization_id, "floor": choice.floor,
                    "quantum": choice.quantum, "ceiling": ceiling})
                if row is None:  # every eligible task of it is being leased by someone else
                    continue
                virtual_time, live, waited, policy = row[TASK_COLUMNS:]
                if virtual_time is None:  # it reached its cap, or concurrent leases moved it past the next
                    raise _Refused(choice.candidate.organization_id)
                task, head = task_from_row(row[:TASK_COLUMNS])
                grant = fairness.grant_record(choice, candidates, virtual_time=virtual_time, live=live,
                                              waited_seconds=waited)
                events = decide(task, GrantLease(attempt_id=self.new_id(), worker=worker,
                                                 lease_token_hash=hash_token(token), request_id=request_id,
                                                 fair_share=grant),
                                now=now, actor=actor)
                leased = project_task(events, task)
                assert leased is not None and leased.current_attempt is not None
                try:  # before the lease is appended: no lease commits whose answer cannot be built
                    polled = answered(Poll(Acquired(task=leased, attempt=leased.current_attempt, lease_token=token,
                                                    target_policy=policy), cancelling, undelivered))
                except (TypeError, ValueError, RecursionError) as exc:
                    # Nothing of this transaction commits (the organisation's counters included);
                    # the task is cancelled on its own, and the acquire goes on.
                    raise _Undeliverable(task.id) from exc
                tx.append(head, events)
                return polled, events
            return answered(Poll(None, cancelling, undelivered)), []

        while True:
            try:
                polled, events = await self.db.run(body, key=worker_id)
            except _Refused:
                tries += 1
                continue
            except _Undeliverable as undeliverable:
                await self._gateway_command(undeliverable.task_id, RequestCancel(reason=UNDELIVERABLE), "gateway")
                continue
            self.observe(events)
            return polled

    # --- worker writes --------------------------------------------------------------------

    async def mark_running(self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str,
                           *, actor: str | None = None, fingerprint: str | None = None) -> TaskState:
        """leased -> running (idempotent)."""
        task, _ = await self._worker_write(worker_id, task_id, attempt_id, lease_token, actor,
                                           [lambda a, h, _b: MarkRunning(a, h)], fingerprint=fingerprint)
        return task

    async def renew(self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str,
                    *, actor: str | None = None, fingerprint: str | None = None) -> Renewed:
        """Extend the lease; the answer says whether the worker should stop (cancel requested)."""
        task, _ = await self._worker_write(worker_id, task_id, attempt_id, lease_token, actor,
                                           [lambda a, h, _b: Renew(a, h)], fingerprint=fingerprint,
                                           write="renew")
        return Renewed(task=task, cancel_requested=task.state == "cancelling")

    async def submit_batch(self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str, *,
                           sequence_number: int, idempotency_key: str, payload_sha256: str,
                           records: list[Any], final: bool, actor: str | None = None,
                           fingerprint: str | None = None) -> BatchReceipt:
        """RFC "Result submission": accept a batch once; a repeat with the same key and sha256
        returns the original acknowledgement, with another sha256 it is refused."""
        batch = ResultBatch(sequence_number, idempotency_key, payload_sha256, records, final)
        batch_id, submit, payload = self._batch_command(batch)
        task, existing = await self._worker_write(
            worker_id, task_id, attempt_id, lease_token, actor, [submit], idempotency_key=idempotency_key,
            payload=payload, fingerprint=fingerprint)
        if existing is not None:
            return BatchReceipt(batch=existing, task=task, duplicate=True)
        return BatchReceipt(batch=BatchRecord(
            batch_id=batch_id, attempt_id=attempt_id, sequence_number=sequence_number,
            idempotency_key=idempotency_key, payload_sha256=payload[0], record_count=len(records),
            final=final, accepted_at=task.updated_at), task=task, duplicate=False)

    async def complete(self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str,
                       *, final_batch: ResultBatch | None = None, actor: str | None = None,
                       fingerprint: str | None = None) -> TaskState:
        """running -> completed; needs an accepted final batch. Repeating it is safe.

        With ``final_batch``, the attempt's last batch is submitted and the task completed in one
        transaction: exactly :meth:`submit_batch` (``final=True``) followed by :meth:`complete`,
        with the same idempotency (a batch already accepted under its key is not stored again),
        and nothing done when the batch is refused.
        """
        if final_batch is None:
            task, _ = await self._worker_write(worker_id, task_id, attempt_id, lease_token, actor,
                                               [lambda a, h, _b: Complete(a, h)], fingerprint=fingerprint)
            return task
        if not final_batch.final:
            raise InvalidRequest("the batch sent with complete is the final one (final: true)")
        _, submit, payload = self._batch_command(final_batch)
        task, _ = await self._worker_write(
            worker_id, task_id, attempt_id, lease_token, actor, [submit, lambda a, h, _b: Complete(a, h)],
            idempotency_key=final_batch.idempotency_key, payload=payload, fingerprint=fingerprint)
        return task

    def _batch_command(self, batch: ResultBatch) -> tuple[UUID, WriteMaker, tuple[str, bytes]]:
        """The id of a new batch, the command that submits ``batch`` (its sha256 recomputed over
        the canonical JSON of the records and compared with the one sent), and the payload."""
        body = canonical_payload(batch.records)
        computed = hashlib.sha256(body).hexdigest()
        if computed != batch.payload_sha256.lower():
            raise InvalidRequest("payload_sha256 does not match the payload received", expected=computed)
        batch_id = self.new_id()

        def command(attempt: AttemptState, token_hash: str, existing: BatchRecord | None) -> SubmitBatch:
            return SubmitBatch(attempt, token_hash, batch_id=batch_id, sequence_number=batch.sequence_number,
                               idempotency_key=batch.idempotency_key, payload_sha256=computed,
                               record_count=len(batch.records), final=batch.final, existing=existing)

        return batch_id, command, (computed, body)

    async def fail(self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str, *,
                   error: str, retryable: bool = True, actor: str | None = None,
                   fingerprint: str | None = None) -> TaskState:
        """The attempt failed: retry_wait (with backoff) if retryable and attempts remain."""
        task, _ = await self._worker_write(worker_id, task_id, attempt_id, lease_token, actor,
                                           [lambda a, h, _b: Fail(a, h, error=error, retryable=retryable)],
                                           fingerprint=fingerprint)
        return task

    async def acknowledge_cancel(self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str,
                                 *, actor: str | None = None, fingerprint: str | None = None) -> TaskState:
        """cancelling -> cancelled, on the worker's word that it stopped."""
        task, _ = await self._worker_write(worker_id, task_id, attempt_id, lease_token, actor,
                                           [lambda a, h, _b: AcknowledgeCancel(a, h)], fingerprint=fingerprint,
                                           write="cancel-ack")
        return task

    async def _worker_write(
        self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str, actor: str | None,
        makers: Sequence[WriteMaker], *,
        idempotency_key: str | None = None, payload: tuple[str, bytes] | None = None,
        write: str = "write", fingerprint: str | None = None,
    ) -> tuple[TaskState, BatchRecord | None]:
        """One worker write (``write`` names it: renew and cancel-ack have their own standing rule,
        see :func:`refuse_after_revocation`).

        The worker row is share-locked first, the task row then locked: revocation locks the
        worker row too, so the write either commits before the revocation does or reads the
        revocation's outcome, and nothing it should refuse commits after it. With the caller's
        certificate ``fingerprint`` (the Gateway passes it), the certificate is checked too:
        Forbidden, and nothing done or recorded, when it is not ``worker_id``'s or the worker is
        revoked or disabled."""
        async def body(tx: Transaction) -> tuple[TaskState, BatchRecord | None, list[DomainEvent],
                                                  WriteRejected | None, TaskState]:
            row, standing = await _lock_for_write(tx, {
                "task_id": task_id, "attempt_id": attempt_id, "idempotency_key": idempotency_key,
                "worker_id": worker_id, "now": self.clock()}, fingerprint)
            # A task or attempt that does not exist, or an attempt of another worker, is not
            # this worker's business: the same 404 either way, and nothing is recorded.
            if row is None:
                raise no_such_attempt(task_id, attempt_id)
            task, head = task_from_row(row)
            ref_offset = TASK_COLUMNS + ATTEMPT_COLUMNS
            attempt = attempt_from_row(row[ref_offset:ref_offset + ATTEMPT_COLUMNS], task.id)
            if attempt is None or attempt.worker_id != worker_id:
                raise no_such_attempt(task_id, attempt_id)
            refuse_after_revocation(standing, write, task)
            existing = batch_from_row(row[ref_offset + ATTEMPT_COLUMNS:-1])
            now: datetime = row[-1]
            events: list[DomainEvent] = []
            so_far, token_hash = task, hash_token(lease_token)
            for make in makers:  # in order, each on the state the previous ones left
                current = so_far.current_attempt
                named = current if current is not None and current.id == attempt.id else attempt
                decided = decide(so_far, make(named, token_hash, existing), now=now,
                                 actor=actor or f"worker:{worker_id}", draw=self.rng.random(),
                                 retry_policy=self.retry_policy)
                events += decided
                if decided and isinstance(decided[0], WriteRejected):
                    break
                so_far = project_task(decided, so_far) or so_far
            rejection = next((e for e in events if isinstance(e, WriteRejected)), None)
            rejected = rejection is not None
            if rejection is not None and not await self._record_rejection(tx, rejection, now):
                events = [e for e in events if e is not rejection]  # counted only (it is the last)
            if payload is not None and events and not rejected:
                tx.write("result_payloads", "payload_store", {"sha256": payload[0], "body": payload[1]})

            async def ingest() -> None:
                if payload is not None and not rejected:
                    for event in events:  # only a newly accepted batch: a duplicate has no events
                        if isinstance(event, ResultBatchAccepted):
                            await ingest_batch(tx, task, event.batch_id, orjson.loads(payload[1]), now)

            after, settled = await self._commit(tx, task, head, events, now, appended=ingest)
            return after, existing, [*events, *settled], rejection, task

        after, existing, events, rejection, before = await self.db.run(body, key=worker_id)
        self.observe(events)
        self._observe_legs(before, events)
        if rejection is not None:  # recorded (or counted); now refuse the write
            raise rejection_error(rejection)
        return after, existing if not events and existing is not None else None

    async def _record_rejection(self, tx: Transaction, rejection: WriteRejected, now: datetime) -> bool:
        """Count a refused write of ``rejection.attempt_id``; whether its ``WriteRejected`` event
        is to be recorded: the first :data:`MAX_RECORDED_REJECTIONS` of an attempt are, the rest
        are only counted (``rejected_write_counts.unrecorded``), so that a worker replaying bad
        writes cannot grow the log without bound. Under the task lock, like the write."""
        seen = await tx.one("rejected_writes_of_attempt", {"attempt_id": rejection.attempt_id})
        record = (seen[0] if seen is not None else 0) < MAX_RECORDED_REJECTIONS
        tx.write("rejected_write_counts", "rejected_write_count",
                 {"attempt_id": rejection.attempt_id, "recorded": int(record), "now": now})
        return record

    # --- operator / gateway commands ------------------------------------------------------

    async def request_cancel(self, task_id: UUID, *, reason: str = "cancel requested",
                             actor: str = "system") -> TaskState:
        """pending/retry_wait -> cancelled at once; leased/running -> cancelling. Repeats are no-ops."""
        return await self._gateway_command(task_id, RequestCancel(reason=reason), actor)

    async def cancels_delivered(self, worker_id: UUID, attempts: Sequence[tuple[UUID, UUID]], *,
                                channel: CancelChannel, actor: str) -> None:
        """Record that the cancellation of each (task, attempt) is in an answer to its worker now
        (``CancelDelivered``, once per cancellation: later deliveries record nothing)."""
        for task_id, attempt_id in attempts:
            delivered = await self.db.run(partial(self._deliver_cancel, task_id=task_id, attempt_id=attempt_id,
                                                  channel=channel, actor=actor), key=worker_id)
            if delivered is not None:
                before, events = delivered
                self.observe(events)
                self._observe_legs(before, events)

    async def _deliver_cancel(self, tx: Transaction, *, task_id: UUID, attempt_id: UUID, channel: CancelChannel,
                              actor: str) -> tuple[TaskState, list[DomainEvent]] | None:
        row = await _lock_task_and_read(tx, "task_read", {"task_id": task_id, "now": self.clock()})
        if row is None:
            return None
        task, head = task_from_row(row)
        events = decide(task, DeliverCancel(attempt_id, channel), now=row[-1], actor=actor)
        await self._commit(tx, task, head, events, row[-1])
        return task, events

    def _observe_legs(self, task: TaskState, events: Sequence[DomainEvent]) -> None:
        for leg, channel, seconds in cancel_legs(task, events):
            self.observe_cancel(leg, channel, seconds)

    async def retry(self, task_id: UUID, *, reason: str = "retried by an operator", attempts: int | None = None,
                    actor: str = "system") -> TaskState:
        """failed_terminal -> pending with a fresh attempt budget (:class:`domain.task.RetryTask`).

        One transaction: the task's lock, then its scan's (the lifecycle's lock order). A failed
        scan is reopened (``ScanReopened``) so that it settles again when the task ends; a
        cancelled scan refuses (409), as does a task in any other state.
        """
        async def body(tx: Transaction) -> tuple[TaskState, list[DomainEvent]]:
            row = await _lock_task_and_read(tx, "task_read", {"task_id": task_id, "now": self.clock()})
            if row is None:
                raise NotFound("no such task", task_id=str(task_id))
            task, head = task_from_row(row)
            now: datetime = row[-1]
            events = decide(task, RetryTask(reason=reason, attempts=attempts), now=now, actor=actor)
            scan = await tx.one("scan_lock_for_orchestration", {"scan_id": task.scan_id})
            assert scan is not None, "the foreign key guarantees the scan"
            _, version, head_hash, status, cancel_requested, org_id, *_ = scan
            reopened = scan_rules.reopen_for_retry(task.scan_id, version, status, cancel_requested,
                                                   task_id=task_id, reason=reason, now=now, actor=actor)
            after, _ = await self._commit(tx, task, head, events, now)
            tx.append(StreamHead(task.scan_id, version, bytes(head_hash)), reopened)
            tx.notify(wakeups.available(org_id))
            return after, [*events, *reopened]

        task, events = await self.db.run(body)
        self.observe(events)
        return task

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
        now: datetime = row[-1]
        events = decide(task, command, now=now, actor=actor, draw=self.rng.random(),
                        retry_policy=self.retry_policy)
        after, settled = await self._commit(tx, task, head, events, now)
        return after, [*events, *settled]

    # --- sweeper --------------------------------------------------------------------------

    async def expire_leases(self, *, limit: int = 100) -> int:
        """Expired leases -> retry_wait (with backoff) or failed_terminal. Returns tasks changed."""
        return await self._sweep("tasks_lock_expired_leases", {}, limit,
                                 lambda t: ExpireLease(t.current_attempt.id) if t.current_attempt else None)

    async def exceed_deadlines(self, *, limit: int = 100) -> int:
        """Attempts past the execution deadline fail as timeouts."""
        return await self._sweep("tasks_lock_past_deadline", {}, limit,
                                 lambda t: ExceedDeadline(t.current_attempt.id) if t.current_attempt else None)

    async def terminate_cancelling(self, *, limit: int = 100) -> int:
        """``cancelling`` tasks whose worker never acknowledged within the grace -> cancelled."""
        return await self._sweep("tasks_lock_cancelling_overdue", {"grace": self.cancel_grace}, limit,
                                 lambda t: TerminateCancelling(self.cancel_grace))

    async def clear_queue_flags(self, *, limit: int = 1000) -> int:
        """Keep the queued-work flags (migration 0021): turn the raises into flags, then lower those
        of organisations with no task of that type queued any more; how many were lowered.
        Never waits for a lock; one process at a time (another one's pass is skipped)."""
        async with self.db.transaction() as tx:
            (mine,) = await tx.value("org_queued_work_try_lock", {})
            if not mine:
                return 0
            await tx.value("org_queued_work_take_raises", {})
            locked = await tx.all("org_queued_work_lock_flagged", {"limit": limit})
            cleared = await tx.all("org_queued_work_clear", {
                "organization_ids": [org for org, _ in locked], "task_types": [kind for _, kind in locked]})
            await tx.commit()
        return len(cleared)

    async def _sweep(self, query: str, params: dict[str, Any], limit: int,
                     make: Callable[[TaskState], Any]) -> int:
        changed: list[DomainEvent] = []
        swept: set[UUID] = set()
        releases: dict[UUID, int] = {}
        async with self.db.transaction() as tx:
            locked = await tx.all(query, {**params, "limit": limit, "now": self.clock()})
            # Scan order: settling a scan locks it, and every sweeper must lock scans in one order.
            ids = [task_id for task_id, _ in sorted(locked, key=lambda r: (r[1], r[0]))]
            for task_id in ids:  # locked above; re-read each in a fresh statement snapshot
                row = await tx.one("task_read", {"task_id": task_id, "now": self.clock()})
                assert row is not None
                task, head = task_from_row(row)
                command = make(task)
                if command is None:
                    continue
                events = decide(task, command, now=row[-1], actor="sweeper", draw=self.rng.random(),
                                retry_policy=self.retry_policy)
                _, settled = await self._commit(tx, task, head, events, row[-1], releases)
                changed += [*events, *settled]
                swept.update(e.originator_id for e in events)
            release_attempts(tx, releases, None)
            await tx.commit()
        self.observe(changed)
        return len(swept)

    # --- shared tail of every command -----------------------------------------------------

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
        settled: list[DomainEvent] = []
        if after.state in TERMINAL and task.state not in TERMINAL:
            settled = await settle_scan(tx, after.scan_id, now, new_id=self.new_id)
        return after, settled

    # --- revocation (operator API) --------------------------------------------------------

    async def cancel_worker_attempts(self, worker_id: UUID, *, organization_id: UUID | None = None,
                                     reason: str, actor: str, at_once: bool = False) -> list[UUID]:
        """Revocation policy, applied to each live attempt of the worker (of one organisation, or
        all); the ids of the tasks this call changed.

        * ``at_once=False`` (revoking the worker or an assignment, removing an assignment): ask
          the attempt to stop — its task goes ``cancelling``, the worker is told and acknowledges
          (or the Gateway ends it after the grace period) and the task ends ``cancelled``.
        * ``at_once=True`` (disabling the worker, which can no longer hear or acknowledge a
          cancel): end the attempt now (``AttemptRevoked``); its task is free for another worker
          at once (``retry_wait``), or ``failed_terminal`` when no attempts remain. A task
          already ``cancelling`` on the worker ends ``cancelled``.

        Runs after the worker change committed, one transaction per task. Under the task lock it
        re-checks that the attempt is still the task's live one: a task whose lease lapsed and
        which another worker leased meanwhile is not touched. Safe to repeat: a revocation
        interrupted midway is finished by running it again.
        """
        async with self.db.read() as reader:
            targets = [(task_id, attempt_id) for task_id, attempt_id in await reader.all(
                "worker_attempts_to_cancel", {"worker_id": worker_id, "organization_id": organization_id,
                                              "include_cancelling": at_once})]
        changed: list[UUID] = []
        for task_id, attempt_id in targets:
            command = RevokeAttempt(attempt_id, reason) if at_once else RequestCancel(reason=reason)
            events = await self.db.run(partial(self._end_live_attempt, task_id=task_id, attempt_id=attempt_id,
                                               command=command, actor=actor), key=worker_id)
            if events:
                self.observe(events)
                changed.append(task_id)
        return changed

    async def _end_live_attempt(self, tx: Transaction, *, task_id: UUID, attempt_id: UUID,
                                command: RequestCancel | RevokeAttempt, actor: str) -> list[DomainEvent]:
        """Under the task lock: apply ``command`` if ``attempt_id`` is still the task's live
        attempt; the events appended (none when it finished, expired or was re-leased since it
        was listed)."""
        row = await _lock_task_and_read(tx, "task_read", {"task_id": task_id, "now": self.clock()})
        if row is None:
            return []
        task, head = task_from_row(row)
        current = task.current_attempt
        if current is None or current.id != attempt_id or not current.live:
            return []
        events = decide(task, command, now=row[-1], actor=actor,
                        draw=self.rng.random(), retry_policy=self.retry_policy)
        _, settled = await self._commit(tx, task, head, events, row[-1])
        return [*events, *settled]


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


class _Undeliverable(Exception):  # a control-flow signal, not an error anyone sees
    """The task's lease answer cannot be encoded (a task stored before the input limits)."""

    def __init__(self, task_id: UUID) -> None:
        super().__init__(str(task_id))
        self.task_id = task_id


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
