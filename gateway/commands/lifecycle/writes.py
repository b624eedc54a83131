"""The task lifecycle: the worker's writes on its attempt: running, renew, result batches, complete, fail, cancel-ack."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

import orjson

from leasehold.domain.errors import InvalidRequest
from leasehold.domain.events import (
    DomainEvent,
    ResultBatchAccepted,
    WriteRejected,
)
from leasehold.domain.results import canonical_payload
from leasehold.domain.task import (
    AcknowledgeCancel,
    AttemptState,
    BatchRecord,
    Complete,
    Fail,
    MarkRunning,
    Renew,
    SubmitBatch,
    TaskState,
    decide,
    project_task,
    rejection_error,
)
from leasehold.gateway.commands.ingestion import ingest_batch
from leasehold.gateway.commands.lifecycle.base import (
    MAX_RECORDED_REJECTIONS,
    BatchReceipt,
    LifecycleBase,
    Renewed,
    ResultBatch,
    WriteMaker,
    _lock_for_write,
    hash_token,
    no_such_attempt,
    refuse_after_revocation,
)
from leasehold.persistence.task_rows import (
    named_attempt,
    stored_batch,
    task_from_row,
)
from leasehold.persistence.transaction import Transaction


class Payload(NamedTuple):
    """A result batch's records as stored: their canonical JSON and its sha256."""

    sha256: str
    body: bytes


class WorkerWrites(LifecycleBase):
    """The worker's writes on its attempt: running, renew, result batches, complete, fail, cancel-ack (part of :class:`Lifecycle`)."""

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
            idempotency_key=idempotency_key, payload_sha256=payload.sha256, record_count=len(records),
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

    def _batch_command(self, batch: ResultBatch) -> tuple[UUID, WriteMaker, Payload]:
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

        return batch_id, command, Payload(computed, body)

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
        idempotency_key: str | None = None, payload: Payload | None = None,
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
            attempt = named_attempt(row)
            if attempt is None or attempt.worker_id != worker_id:
                raise no_such_attempt(task_id, attempt_id)
            refuse_after_revocation(standing, write, task)
            existing = stored_batch(row)
            now: datetime = row.now
            events: list[DomainEvent] = []
            so_far, token_hash = task, hash_token(lease_token)
            for make in makers:  # in order, each on the state the previous ones left
                current = so_far.current_attempt
                named = current if current is not None and current.id == attempt.id else attempt
                decided = decide(so_far, make(named, token_hash, existing), now=now,
                                 actor=actor or f"worker:{worker_id}", draw=self.rng.random(),
                                 retry_policy=self.retry_policy)
                events += decided
                if decided and isinstance(next(iter(decided)), WriteRejected):
                    break
                so_far = project_task(decided, so_far) or so_far
            rejection = next((e for e in events if isinstance(e, WriteRejected)), None)
            rejected = rejection is not None
            if rejection is not None and not await self._record_rejection(tx, rejection, now):
                events = [e for e in events if e is not rejection]  # counted only (it is the last)
            if payload is not None and events and not rejected:
                tx.write("result_payloads", "payload_store", {"sha256": payload.sha256, "body": payload.body})

            async def ingest() -> None:
                if payload is not None and not rejected:
                    for event in events:  # only a newly accepted batch: a duplicate has no events
                        if isinstance(event, ResultBatchAccepted):
                            await ingest_batch(tx, task, event.batch_id, orjson.loads(payload.body), now)

            after, settled = await self._commit(tx, task, head, events, now, appended=ingest)
            return after, existing, [*events, *settled], rejection, task

        after, existing, events, rejection, before = await self.db.run(body)
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
        record = (seen.recorded if seen is not None else 0) < MAX_RECORDED_REJECTIONS
        tx.write("rejected_write_counts", "rejected_write_count",
                 {"attempt_id": rejection.attempt_id, "recorded": int(record), "now": now})
        return record

