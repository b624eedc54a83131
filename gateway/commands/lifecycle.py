"""Task lifecycle commands: create, acquire, worker writes, cancel, and the sweeper's steps.

Each public method is one transaction (see :mod:`persistence.transaction`):

1. lock the task row (``FOR UPDATE``; ``SKIP LOCKED`` when choosing work),
2. decide with :func:`domain.task.decide`,
3. append the events and apply their projections (:func:`persistence.event_log.append`),
4. when the task reached a terminal state, lock its scan and settle the scan's status,
5. commit.

A worker write refused by fencing is still committed, as a ``WriteRejected`` event, and the
matching error is raised after the commit.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import orjson
from psycopg import AsyncCursor
from psycopg_pool import AsyncConnectionPool

from domain import scan as scan_rules
from domain.errors import Forbidden, InvalidRequest, InvalidTransition, NotFound
from domain.events import DomainEvent, ProfileStep, ResultBatchAccepted, ScanStatus, WriteRejected
from domain.results import canonical_payload
from domain.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from domain.task import (
    AcknowledgeCancel,
    AttemptState,
    BatchRecord,
    Complete,
    CreateTask,
    ExceedDeadline,
    ExpireLease,
    Fail,
    Lease,
    MarkRunning,
    ReissueLease,
    Renew,
    RequestCancel,
    SubmitBatch,
    TaskState,
    TerminateCancelling,
    WorkerView,
    WorkerWrite,
    decide,
    project_task,
    rejection_error,
)
from gateway.background import notify
from gateway.commands.ingestion import ingest_batch
from persistence import writes as sql_writes
from persistence.event_log import StreamHead, append
from persistence.queries import QUERIES
from persistence.task_rows import (
    ATTEMPT_COLUMNS,
    TASK_COLUMNS,
    attempt_from_row,
    batch_from_row,
    caller_standing,
    task_from_row,
)
from persistence.transaction import Clock, system_clock, transaction

TERMINAL = frozenset({"completed", "failed_terminal", "cancelled"})


def hash_token(token: str) -> str:
    """Hex sha256 of a lease token; only this ever reaches the database or the log."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Acquired:
    """A fresh lease: the only time the plaintext ``lease_token`` is ever returned."""

    task: TaskState
    attempt: AttemptState
    lease_token: str


@dataclass(frozen=True, slots=True)
class Poll:
    """What one acquire round found: a lease (or None), and the worker's attempts to stop."""

    acquired: Acquired | None
    cancel_requested: list[tuple[UUID, UUID]]


@dataclass(frozen=True, slots=True)
class Renewed:
    task: TaskState
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class BatchAck:
    """The acknowledgement of an accepted batch (the original one when a retry repeats it)."""

    batch: BatchRecord
    task: TaskState
    duplicate: bool


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

    def __init__(self, pool: AsyncConnectionPool, *, clock: Clock = system_clock,
                 rng: random.Random | None = None, retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY,
                 cancel_grace: timedelta = timedelta(seconds=30),
                 new_id: Callable[[], UUID] = uuid4) -> None:
        self.pool = pool
        self.clock = clock
        self.rng = rng or random.Random()
        self.retry_policy = retry_policy
        self.cancel_grace = cancel_grace
        self.new_id = new_id
        #: Called with the events of every committed command (metrics hook).
        self.observe: Callable[[Sequence[DomainEvent]], None] = lambda events: None

    # --- creation -------------------------------------------------------------------------

    async def create_task(self, scan_id: UUID, spec: TaskSpec, *, actor: str = "system") -> TaskState:
        """Queue a job on the scan and create its task (one transaction, scan row locked)."""
        job_id, task_id = self.new_id(), self.new_id()
        async with transaction(self.pool) as cur:
            async with cur.connection.cursor() as lock_cur:
                await lock_cur.execute(QUERIES["scan_lock"], {"scan_id": scan_id, "now": self.clock()})
                await cur.execute(QUERIES["scan_next_job_position"], {"scan_id": scan_id, "now": self.clock()})
                row = await lock_cur.fetchone()
            if row is None:
                raise NotFound("no such scan", scan_id=str(scan_id))
            _, version, head_hash, org_id, status, mode, _, has_profile = row
            next_position, now = await _fetch_one(cur)
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
                priority=spec.priority, scope=spec.scope or {}, parameters=spec.parameters or {},
                max_attempts=spec.max_attempts, lease_seconds=spec.lease_seconds,
                execution_timeout_seconds=spec.execution_timeout_seconds), now=now, actor=actor)
            await append(cur, StreamHead(scan_id, version, bytes(head_hash)), [queued])
            await append(cur, StreamHead(task_id), created)
            await notify.send(cur, notify.available(org_id))
        self.observe([queued, *created])
        task = project_task(created)
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
                   notices: bool = True, fingerprint: str | None = None) -> Poll:
        """:meth:`acquire`, plus (in the same round trip) the worker's attempts whose task is being
        cancelled — what a long-poll answer must tell the worker.

        With the caller's certificate ``fingerprint`` (the Gateway passes it), the worker's
        standing is checked in this transaction, in the same round trip as the worker lock:
        Forbidden, and nothing done, when the certificate is not ``worker_id``'s or the worker
        is revoked or disabled.
        """
        actor = actor or f"worker:{worker_id}"
        token = secrets.token_urlsafe(32)
        async with transaction(self.pool) as cur:
            params = {"worker_id": worker_id, "now": self.clock(), "request_id": request_id,
                      "fingerprint": fingerprint}
            async with cur.connection.cursor() as lock_cur, cur.connection.cursor() as request_cur, \
                    cur.connection.cursor() as notice_cur, cur.connection.cursor() as caller_cur:
                if fingerprint is not None:
                    await caller_cur.execute(QUERIES["worker_by_fingerprint"], params)
                await lock_cur.execute(QUERIES["worker_lock_for_acquire"], params)
                await cur.execute(QUERIES["worker_live_attempts"], params)
                if request_id is not None:
                    await request_cur.execute(QUERIES["attempt_by_acquire_request"], params)
                if notices:
                    await notice_cur.execute(QUERIES["worker_cancelling_attempts"], params)
                row = await lock_cur.fetchone()
                earlier = await request_cur.fetchone() if request_id is not None else None
                cancelling = [(t, a) for t, a in await notice_cur.fetchall()] if notices else []
                if fingerprint is not None:
                    caller_standing(await caller_cur.fetchone(), worker_id)
            if row is None:
                raise NotFound("no such worker", worker_id=str(worker_id))
            live_attempts, now, *_plan_pinned = await _fetch_one(cur)
            if earlier is not None:
                task, _ = await self._decide_locked(cur, earlier[0], ReissueLease(
                    attempt_id=earlier[1], lease_token_hash=hash_token(token)), actor)
                assert task.current_attempt is not None
                return Poll(Acquired(task=task, attempt=task.current_attempt, lease_token=token), cancelling)
            worker = WorkerView(id=row[0], enabled=row[1], revoked=row[2], max_concurrent_tasks=row[3],
                                capabilities=frozenset(row[4]), task_types=frozenset(row[5]),
                                live_attempts=live_attempts)
            if not worker.enabled or worker.revoked or worker.live_attempts >= worker.max_concurrent_tasks:
                return Poll(None, cancelling)
            await cur.execute(QUERIES["task_lock_acquirable"], {
                "worker_id": worker_id, "now": now, "task_types": sorted(worker.task_types),
                "capabilities": sorted(worker.capabilities)})
            row = await cur.fetchone()
            if row is None:
                return Poll(None, cancelling)
            task, head = task_from_row(row)
            events = decide(task, Lease(attempt_id=self.new_id(), worker=worker,
                                        lease_token_hash=hash_token(token), request_id=request_id),
                            now=now, actor=actor)
            await append(cur, head, events)
        self.observe(events)
        leased = project_task(events, task)
        assert leased is not None and leased.current_attempt is not None
        return Poll(Acquired(task=leased, attempt=leased.current_attempt, lease_token=token), cancelling)

    # --- worker writes --------------------------------------------------------------------

    async def mark_running(self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str,
                           *, actor: str | None = None, fingerprint: str | None = None) -> TaskState:
        """leased -> running (idempotent)."""
        task, _ = await self._worker_write(worker_id, task_id, attempt_id, lease_token, actor,
                                           lambda a, h, _b: MarkRunning(a, h), fingerprint=fingerprint)
        return task

    async def renew(self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str,
                    *, actor: str | None = None, fingerprint: str | None = None) -> Renewed:
        """Extend the lease; the answer says whether the worker should stop (cancel requested)."""
        task, _ = await self._worker_write(worker_id, task_id, attempt_id, lease_token, actor,
                                           lambda a, h, _b: Renew(a, h), check_standing=True,
                                           fingerprint=fingerprint)
        return Renewed(task=task, cancel_requested=task.state == "cancelling")

    async def submit_batch(self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str, *,
                           sequence_number: int, idempotency_key: str, payload_sha256: str,
                           records: list[Any], final: bool, actor: str | None = None,
                           fingerprint: str | None = None) -> BatchAck:
        """RFC "Result submission": accept a batch once; a repeat with the same key and sha256
        returns the original acknowledgement, with another sha256 it is refused."""
        body = canonical_payload(records)
        computed = hashlib.sha256(body).hexdigest()
        if computed != payload_sha256.lower():
            raise InvalidRequest("payload_sha256 does not match the payload received",
                                 expected=computed)
        batch_id = self.new_id()

        def command(attempt: AttemptState, token_hash: str, existing: BatchRecord | None) -> SubmitBatch:
            return SubmitBatch(attempt, token_hash, batch_id=batch_id, sequence_number=sequence_number,
                               idempotency_key=idempotency_key, payload_sha256=computed,
                               record_count=len(records), final=final, existing=existing)

        task, existing = await self._worker_write(
            worker_id, task_id, attempt_id, lease_token, actor, command, idempotency_key=idempotency_key,
            payload=(computed, body), fingerprint=fingerprint)
        if existing is not None:
            return BatchAck(batch=existing, task=task, duplicate=True)
        assert task.current_attempt is not None
        return BatchAck(batch=BatchRecord(
            batch_id=batch_id, attempt_id=attempt_id, sequence_number=sequence_number,
            idempotency_key=idempotency_key, payload_sha256=computed, record_count=len(records),
            final=final, accepted_at=task.updated_at), task=task, duplicate=False)

    async def complete(self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str,
                       *, actor: str | None = None, fingerprint: str | None = None) -> TaskState:
        """running -> completed; needs an accepted final batch. Repeating it is safe."""
        task, _ = await self._worker_write(worker_id, task_id, attempt_id, lease_token, actor,
                                           lambda a, h, _b: Complete(a, h), fingerprint=fingerprint)
        return task

    async def fail(self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str, *,
                   error: str, retryable: bool = True, actor: str | None = None,
                   fingerprint: str | None = None) -> TaskState:
        """The attempt failed: retry_wait (with backoff) if retryable and attempts remain."""
        task, _ = await self._worker_write(worker_id, task_id, attempt_id, lease_token, actor,
                                           lambda a, h, _b: Fail(a, h, error=error, retryable=retryable),
                                           fingerprint=fingerprint)
        return task

    async def acknowledge_cancel(self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str,
                                 *, actor: str | None = None, fingerprint: str | None = None) -> TaskState:
        """cancelling -> cancelled, on the worker's word that it stopped."""
        task, _ = await self._worker_write(worker_id, task_id, attempt_id, lease_token, actor,
                                           lambda a, h, _b: AcknowledgeCancel(a, h), fingerprint=fingerprint)
        return task

    async def _worker_write(
        self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str, actor: str | None,
        make: Callable[[AttemptState, str, BatchRecord | None], WorkerWrite], *,
        idempotency_key: str | None = None, payload: tuple[str, bytes] | None = None,
        check_standing: bool = False, fingerprint: str | None = None,
    ) -> tuple[TaskState, BatchRecord | None]:
        """One worker write. With the caller's certificate ``fingerprint`` (the Gateway passes
        it), the worker's standing is checked first, in the round trip that locks the task:
        Forbidden, and nothing done or recorded, when the certificate is not ``worker_id``'s or
        the worker is revoked or disabled."""
        rejection: WriteRejected | None = None
        async with transaction(self.pool) as cur:
            row = await _lock_task_and_read(cur, "task_read_for_write", {
                "task_id": task_id, "attempt_id": attempt_id, "idempotency_key": idempotency_key,
                "now": self.clock()}, caller=(fingerprint, worker_id) if fingerprint is not None else None)
            # A task or attempt that does not exist, or an attempt of another worker, is not
            # this worker's business: the same 404 either way, and nothing is recorded.
            if row is None:
                raise NotFound("no such task", task_id=str(task_id))
            task, head = task_from_row(row)
            ref_offset = TASK_COLUMNS + ATTEMPT_COLUMNS
            attempt = attempt_from_row(row[ref_offset:ref_offset + ATTEMPT_COLUMNS], task.id)
            if attempt is None or attempt.worker_id != worker_id:
                raise NotFound("no such attempt of this task", task_id=str(task_id),
                               attempt_id=str(attempt_id))
            if check_standing:
                await self._refuse_revoked_renewal(cur, worker_id, task)
            existing = batch_from_row(row[ref_offset + ATTEMPT_COLUMNS:-1])
            now: datetime = row[-1]
            command = make(attempt, hash_token(lease_token), existing)
            events = decide(task, command, now=now, actor=actor or f"worker:{worker_id}",
                            draw=self.rng.random(), retry_policy=self.retry_policy)
            if events and isinstance(events[0], WriteRejected):
                rejection = events[0]
            elif payload is not None and events:
                await sql_writes.write(cur, "result_payloads", QUERIES["payload_store"],
                                       {"sha256": payload[0], "body": payload[1]})
            after = await self._commit(cur, task, head, events, now)
            if payload is not None and rejection is None:
                for event in events:  # only a newly accepted batch: a duplicate has no events
                    if isinstance(event, ResultBatchAccepted):
                        await ingest_batch(cur, task, event.batch_id, orjson.loads(payload[1]), now)
        self.observe(events)
        if rejection is not None:
            raise rejection_error(rejection)
        return after, existing if not events and existing is not None else None

    # --- operator / gateway commands ------------------------------------------------------

    async def request_cancel(self, task_id: UUID, *, reason: str = "cancel requested",
                             actor: str = "system") -> TaskState:
        """pending/retry_wait -> cancelled at once; leased/running -> cancelling. Repeats are no-ops."""
        return await self._gateway_command(task_id, RequestCancel(reason=reason), actor)

    async def _gateway_command(self, task_id: UUID, command: Any, actor: str) -> TaskState:
        async with transaction(self.pool) as cur:
            task, events = await self._decide_locked(cur, task_id, command, actor)
        self.observe(events)
        return task

    async def _decide_locked(self, cur: AsyncCursor[Any], task_id: UUID, command: Any,
                             actor: str) -> tuple[TaskState, Sequence[DomainEvent]]:
        """Lock the task, decide ``command``, append; inside the caller's transaction."""
        row = await _lock_task_and_read(cur, "task_read", {"task_id": task_id, "now": self.clock()})
        if row is None:
            raise NotFound("no such task", task_id=str(task_id))
        task, head = task_from_row(row)
        now: datetime = row[-1]
        events = decide(task, command, now=now, actor=actor, draw=self.rng.random(),
                        retry_policy=self.retry_policy)
        return await self._commit(cur, task, head, events, now), events

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

    async def _sweep(self, query: str, params: dict[str, Any], limit: int,
                     make: Callable[[TaskState], Any]) -> int:
        changed: list[DomainEvent] = []
        async with transaction(self.pool) as cur:
            await cur.execute(QUERIES[query], {**params, "limit": limit, "now": self.clock()})
            # Scan order: settling a scan locks it, and every sweeper must lock scans in one order.
            ids = [task_id for task_id, _ in sorted(await cur.fetchall(), key=lambda r: (r[1], r[0]))]
            for task_id in ids:  # locked above; re-read each in a fresh statement snapshot
                await cur.execute(QUERIES["task_read"], {"task_id": task_id, "now": self.clock()})
                row = await cur.fetchone()
                assert row is not None
                task, head = task_from_row(row)
                command = make(task)
                if command is None:
                    continue
                events = decide(task, command, now=row[-1], actor="sweeper", draw=self.rng.random(),
                                retry_policy=self.retry_policy)
                await self._commit(cur, task, head, events, row[-1])
                changed.extend(events)
        self.observe(changed)
        return len({e.originator_id for e in changed})

    # --- shared tail of every command -----------------------------------------------------

    async def _commit(self, cur: AsyncCursor[Any], task: TaskState, head: StreamHead,
                      events: Sequence[DomainEvent], now: datetime) -> TaskState:
        """Append ``events`` to the task and, if it just ended, settle its scan; the new state."""
        after = project_task(events, task)
        assert after is not None
        await append(cur, head, events)
        if after.state == "cancelling" and task.state != "cancelling" and after.current_attempt is not None:
            await notify.send(cur, notify.cancel(after.current_attempt.worker_id))
        if after.state in TERMINAL and task.state not in TERMINAL:
            await self._settle_scan(cur, after.scan_id, now)
        return after

    async def _settle_scan(self, cur: AsyncCursor[Any], scan_id: UUID, now: datetime) -> None:
        """Lock the scan (lock order: task, then scan); start the next profile step if one is due,
        else finish the scan once every job is terminal.

        The jobs are summarised by a second statement after the lock is granted, so under READ
        COMMITTED the summary includes every job change committed by earlier holders of the scan
        lock (and this transaction's own, already applied).
        """
        async with cur.connection.cursor() as lock_cur:
            await lock_cur.execute(QUERIES["scan_lock_for_orchestration"], {"scan_id": scan_id})
            await cur.execute(QUERIES["scan_jobs_summary"], {"scan_id": scan_id})
            scan_row = await lock_cur.fetchone()
        statuses, job_count, last_status, last_job = await _fetch_one(cur)
        assert scan_row is not None, "the foreign key guarantees the scan"
        _, version, head_hash, scan_status, cancel_requested, org_id, profile, _targets = scan_row
        if scan_status in scan_rules.TERMINAL_SCAN_STATUSES:
            return
        head = StreamHead(scan_id, version, bytes(head_hash))
        steps = profile_steps(profile)
        step = scan_rules.next_step(steps, job_count, last_status, cancel_requested=cancel_requested)
        if step is not None:
            await cur.execute(QUERIES["scan_job_scope"], {"job_id": last_job})
            (last_scope,) = await _fetch_one(cur)
            await cur.execute(QUERIES["scan_found_assets"], {"scan_id": scan_id})
            found = [(kind, value) for kind, value in await cur.fetchall()]
            scope = scan_rules.enrich_scope(dict(last_scope or {}), found)
            events = await queue_step(cur, head, org_id, step, steps[step], scope, now=now, actor="system",
                                      new_id=self.new_id, status=scan_status)
            self.observe(events)
            return
        outcome = scan_rules.scan_outcome(statuses, cancel_requested=cancel_requested)
        if outcome is not None:
            finished = scan_rules.finish_scan(scan_id, version, outcome, now=now, actor="system")
            await append(cur, head, [finished])

    # --- scans --------------------------------------------------------------------------

    async def cancel_scan(self, scan_id: UUID, *, reason: str = "scan cancelled", actor: str = "system",
                          organization_id: UUID | None = None) -> list[TaskState]:
        """Record the scan's cancel request (no further profile steps), then cancel each of its
        unfinished tasks in a transaction of its own (task lock only: the scan lock is never held
        while waiting for a task lock). The scan ends ``cancelled`` when its last job ends (pending
        tasks at once, running ones on the worker's acknowledgement or the sweeper's grace).
        Safe to repeat. The tasks' states after the call.
        """
        async with transaction(self.pool) as cur:
            async with cur.connection.cursor() as lock_cur:
                await lock_cur.execute(QUERIES["scan_lock_for_orchestration"], {"scan_id": scan_id})
                await cur.execute(QUERIES["clock_now"], {"now": self.clock()})
                row = await lock_cur.fetchone()
            (now,) = await _fetch_one(cur)
            if row is None or (organization_id is not None and row[5] != organization_id):
                raise NotFound("no such scan", scan_id=str(scan_id))
            _, version, head_hash, status, cancel_requested, *_ = row
            events: list[DomainEvent] = [*scan_rules.request_cancel(
                scan_id, version, status, cancel_requested, reason=reason, now=now, actor=actor)]
            head = await append(cur, StreamHead(scan_id, version, bytes(head_hash)), events)
            if events and await self._open_task_count(cur, scan_id) == 0:
                # Nothing left to end (no job yet, or every job ended): the scan ends now.
                finished = scan_rules.finish_scan(scan_id, head.version, "cancelled", now=now, actor=actor)
                await append(cur, head, [finished])
                events = [*events, finished]
        self.observe(events)
        async with self.pool.connection() as conn:
            listed = await conn.execute(QUERIES["scan_open_tasks"], {"scan_id": scan_id})
            task_ids = [task_id for (task_id,) in await listed.fetchall()]
        return [await self.request_cancel(task_id, reason=reason, actor=actor) for task_id in task_ids]

    async def _open_task_count(self, cur: AsyncCursor[Any], scan_id: UUID) -> int:
        await cur.execute(QUERIES["scan_open_tasks"], {"scan_id": scan_id})
        return len(await cur.fetchall())

    # --- revocation (operator API) --------------------------------------------------------

    async def cancel_worker_attempts(self, worker_id: UUID, *, organization_id: UUID | None = None,
                                     reason: str, actor: str) -> list[UUID]:
        """Security revocation: ask each live attempt of the worker (of one organisation, or all)
        to stop, moving its task to ``cancelling``; the ids of the tasks this call moved.

        Runs after the revocation committed, one transaction per task. Under the task lock it
        re-checks that the attempt is still the task's live one: a task whose lease lapsed and
        which another worker leased meanwhile is not cancelled. Safe to repeat: a revocation
        interrupted midway is finished by running it again.
        """
        async with self.pool.connection() as conn:
            cur = await conn.execute(QUERIES["worker_attempts_to_cancel"],
                                     {"worker_id": worker_id, "organization_id": organization_id})
            targets = [(task_id, attempt_id) for task_id, attempt_id in await cur.fetchall()]
        cancelled: list[UUID] = []
        for task_id, attempt_id in targets:
            async with transaction(self.pool) as cur:
                row = await _lock_task_and_read(cur, "task_read", {"task_id": task_id, "now": self.clock()})
                if row is None:
                    continue
                task, head = task_from_row(row)
                current = task.current_attempt
                if current is None or current.id != attempt_id or task.state not in ("leased", "running"):
                    continue  # finished, expired or re-leased since it was listed
                events = decide(task, RequestCancel(reason=reason), now=row[-1], actor=actor,
                                draw=self.rng.random(), retry_policy=self.retry_policy)
                await self._commit(cur, task, head, events, row[-1])
            self.observe(events)
            cancelled.append(task_id)
        return cancelled

    async def _refuse_revoked_renewal(self, cur: AsyncCursor[Any], worker_id: UUID, task: TaskState) -> None:
        """RFC "Lease duration": renewal is refused once the worker, or its assignment to the
        task's organisation, is revoked (under the task lock, for every caller of the service).

        A task already ``cancelling`` still answers a worker whose assignment was revoked, so
        that it hears the cancellation; the lease is not extended then anyway.
        """
        await cur.execute(QUERIES["worker_standing"], {"worker_id": worker_id,
                                                       "organization_id": task.organization_id})
        row = await cur.fetchone()
        worker_revoked, assignment_revoked = row if row is not None else (True, True)
        if worker_revoked:
            raise Forbidden("this worker has been revoked")
        if assignment_revoked and task.state != "cancelling":
            raise Forbidden("this worker's assignment to the task's organisation has been revoked")


async def _lock_task_and_read(cur: AsyncCursor[Any], read: str, params: dict[str, Any],
                              caller: tuple[str, UUID] | None = None) -> Any:
    """Lock the task row, then read with a second statement (one round trip, pipelined).

    The read runs after the lock is granted, so its snapshot includes everything committed by
    the previous holder of the lock (see the comment on ``task_lock``). With ``caller``
    (certificate fingerprint, worker id), the worker's standing is read first in the same round
    trip, and checked before anything else (see :func:`caller_standing`).
    """
    if caller is not None:
        async with cur.connection.cursor() as caller_cur:
            await caller_cur.execute(QUERIES["worker_by_fingerprint"], {"fingerprint": caller[0]})
            row = await _lock_task_and_read(cur, read, params)  # same round trip: fetched below
            caller_standing(await caller_cur.fetchone(), caller[1])
        return row
    async with cur.connection.cursor() as lock_cur:
        await lock_cur.execute(QUERIES["task_lock"], params)
        await cur.execute(QUERIES[read], params)
        locked = await lock_cur.fetchone()
    row = await cur.fetchone()
    return row if locked is not None else None


async def _fetch_one(cur: AsyncCursor[Any]) -> tuple[Any, ...]:
    row = await cur.fetchone()
    assert row is not None, "aggregate queries always return a row"
    return tuple(row)


# --- profiles -------------------------------------------------------------------------------



def profile_steps(profile: dict[str, Any] | None) -> list[ProfileStep]:
    """The steps of a scan's stored profile (``scans.profile``); none for an ad-hoc scan."""
    if not profile:
        return []
    return [ProfileStep(**{**step, "required_capabilities": tuple(step["required_capabilities"])})
            for step in profile["steps"]]


async def queue_step(cur: AsyncCursor[Any], scan: StreamHead, organization_id: UUID, index: int,
                     step: ProfileStep, scope: dict[str, Any], *, now: datetime, actor: str,
                     new_id: Callable[[], UUID], status: ScanStatus = "pending") -> list[DomainEvent]:
    """Queue profile step ``index`` as job ``index`` of the scan and create its task, inside the
    caller's transaction, which holds the scan lock (``scan`` is its head)."""
    job_id, task_id = new_id(), new_id()
    queued = scan_rules.queue_job(
        scan.id, scan.version, status, organization_id=organization_id,
        job_id=job_id, position=index, plugin=step.task_type, execution_mode="gateway", now=now, actor=actor)
    created = decide(None, CreateTask(
        task_id=task_id, scan_id=scan.id, scan_job_id=job_id, organization_id=organization_id,
        task_type=step.task_type, required_capabilities=step.required_capabilities, priority=step.priority,
        scope=scope, parameters={"profile_step": index}, max_attempts=step.max_attempts,
        lease_seconds=step.lease_seconds, execution_timeout_seconds=step.execution_timeout_seconds),
        now=now, actor=actor)
    await append(cur, scan, [queued])
    await append(cur, StreamHead(task_id), created)
    await notify.send(cur, notify.available(organization_id))
    return [queued, *created]
