"""Rows of the locking queries -> domain state (column order as in ``persistence/queries``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from leasehold.domain.errors import Forbidden
from leasehold.domain.scopes import ScopeRef
from leasehold.domain.task import AttemptState, BatchRecord, TaskState
from leasehold.persistence.event_log import StreamHead

TASK_COLUMNS = 25
ATTEMPT_COLUMNS = 13
BATCH_COLUMNS = 8


def task_from_row(row: Sequence[Any], task_id_offset: int = 0) -> tuple[TaskState, StreamHead]:
    """A task and its stream head from ``TASK_COLUMNS`` columns, then its current attempt's."""
    r = row[task_id_offset:]
    attempt = attempt_from_row(r[TASK_COLUMNS:TASK_COLUMNS + ATTEMPT_COLUMNS], r[0]) \
        if len(r) > TASK_COLUMNS else None
    task = TaskState(
        id=r[0], version=r[1], scan_id=r[3], scan_job_id=r[4], organization_id=r[5], task_type=r[6],
        required_capabilities=tuple(r[7]), priority=r[8], scope=r[9], parameters=r[10], state=r[11],
        available_at=r[12], attempt_count=r[13], max_attempts=r[14], lease_seconds=r[15],
        execution_timeout_seconds=r[16], cancel_requested_at=r[17], last_error=r[18], created_at=r[19],
        updated_at=r[20], finished_at=r[21], cancel_delivered_at=r[22],
        cancel_delivery_channel=r[23], current_attempt=attempt, scope_ref=ScopeRef.from_json(r[24]),
    )
    return task, StreamHead(r[0], r[1], bytes(r[2]))


def attempt_from_row(r: Sequence[Any], task_id: Any) -> AttemptState | None:
    if r[0] is None:
        return None
    return AttemptState(
        id=r[0], task_id=task_id, worker_id=r[1], attempt_number=r[2], lease_token_hash=bytes(r[3]).hex(),
        status=r[4], leased_at=r[5], lease_expires_at=r[6], deadline_at=r[7], started_at=r[8],
        finished_at=r[9], batch_count=r[10], final_batch_accepted=r[11], error=r[12],
    )


def batch_from_row(r: Sequence[Any]) -> BatchRecord | None:
    if r[0] is None:
        return None
    return BatchRecord(batch_id=r[0], attempt_id=r[1], sequence_number=r[2], idempotency_key=r[3],
                       payload_sha256=r[4], record_count=r[5], final=r[6], accepted_at=r[7])


def caller_standing(row: Sequence[Any] | None, worker_id: Any = None) -> tuple[Any, str]:
    """(worker id, name) of the worker a ``worker_by_fingerprint`` row describes, or the 403 a
    certificate gets when it belongs to no worker (or not to ``worker_id``), or to a revoked
    or disabled one. One wording for the Gateway's identity check and the commands' own."""
    if row is None or (worker_id is not None and row[0] != worker_id):
        raise Forbidden("this certificate does not belong to a registered worker")
    found_id, name, enabled, revoked = row
    if revoked:
        raise Forbidden("this worker has been revoked")
    if not enabled:
        raise Forbidden("this worker is disabled")
    return found_id, name
