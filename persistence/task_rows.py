"""Task rows -> domain state, read by name (the row classes are in :mod:`persistence.rows`)."""

from __future__ import annotations

from typing import Any

from leasehold.domain.errors import Forbidden
from leasehold.domain.scopes import ScopeRef
from leasehold.domain.task import AttemptState, BatchRecord, TaskState
from leasehold.persistence.event_log import StreamHead
from leasehold.persistence.rows import TaskAttemptRow, TaskRow, TaskWriteRow


def task_from_row(row: TaskRow) -> tuple[TaskState, StreamHead]:
    """A task and its stream head; with its current attempt when the row carries one."""
    task = TaskState(
        id=row.id, version=row.version, scan_id=row.scan_id, scan_job_id=row.scan_job_id,
        organization_id=row.organization_id, task_type=row.task_type,
        required_capabilities=tuple(row.required_capabilities), priority=row.priority, scope=row.scope,
        parameters=row.parameters, state=row.state, available_at=row.available_at,
        attempt_count=row.attempt_count, max_attempts=row.max_attempts, lease_seconds=row.lease_seconds,
        execution_timeout_seconds=row.execution_timeout_seconds, cancel_requested_at=row.cancel_requested_at,
        last_error=row.last_error, created_at=row.created_at, updated_at=row.updated_at,
        finished_at=row.finished_at, cancel_delivered_at=row.cancel_delivered_at,
        cancel_delivery_channel=row.cancel_delivery_channel,
        current_attempt=current_attempt(row) if isinstance(row, TaskAttemptRow) else None,
        scope_ref=ScopeRef.from_json(row.scope_ref),
    )
    return task, StreamHead(row.id, row.version, bytes(row.head_hash))


def current_attempt(row: TaskAttemptRow) -> AttemptState | None:
    """The task's current attempt (``current_*``), None when it has none."""
    if row.current_id is None:
        return None
    return AttemptState(
        id=row.current_id, task_id=row.id, worker_id=row.current_worker_id,
        attempt_number=row.current_attempt_number, lease_token_hash=bytes(row.current_lease_token_hash or b"").hex(),
        status=row.current_status, leased_at=row.current_leased_at, lease_expires_at=row.current_lease_expires_at,
        deadline_at=row.current_deadline_at, started_at=row.current_started_at,
        finished_at=row.current_finished_at, batch_count=row.current_batch_count,
        final_batch_accepted=row.current_final_batch_accepted, error=row.current_error,
    )


def named_attempt(row: TaskWriteRow) -> AttemptState | None:
    """The attempt a worker's request names (``named_*``), None when the task has no such attempt."""
    if row.named_id is None:
        return None
    return AttemptState(
        id=row.named_id, task_id=row.id, worker_id=row.named_worker_id,
        attempt_number=row.named_attempt_number, lease_token_hash=bytes(row.named_lease_token_hash or b"").hex(),
        status=row.named_status, leased_at=row.named_leased_at, lease_expires_at=row.named_lease_expires_at,
        deadline_at=row.named_deadline_at, started_at=row.named_started_at,
        finished_at=row.named_finished_at, batch_count=row.named_batch_count,
        final_batch_accepted=row.named_final_batch_accepted, error=row.named_error,
    )


def stored_batch(row: TaskWriteRow) -> BatchRecord | None:
    """The batch already stored under the request's idempotency key (``batch_*``), or None."""
    if row.batch_id is None:
        return None
    return BatchRecord(batch_id=row.batch_id, attempt_id=row.batch_attempt_id,
                       sequence_number=row.batch_sequence_number, idempotency_key=row.batch_idempotency_key,
                       payload_sha256=row.batch_payload_sha256, record_count=row.batch_record_count,
                       final=row.batch_final, accepted_at=row.batch_accepted_at)


def caller_standing(row: Any, worker_id: Any = None) -> tuple[Any, str]:
    """(worker id, name) of the worker a ``worker_by_fingerprint`` row describes, or the 403 a
    certificate gets when it belongs to no worker (or not to ``worker_id``), or to a revoked
    or disabled one. One wording for the Gateway's identity check and the commands' own."""
    if row is None or (worker_id is not None and row.id != worker_id):
        raise Forbidden("this certificate does not belong to a registered worker")
    if row.revoked:
        raise Forbidden("this worker has been revoked")
    if not row.enabled:
        raise Forbidden("this worker is disabled")
    return row.id, row.name
