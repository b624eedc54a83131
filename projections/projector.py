"""Event -> row changes for every read model.

One function per event type (``singledispatch``). Each returns the :mod:`projections.rows`
changes the event makes, including the stream head (``version``, ``head_hash``) kept on the
stream's own row: ``worker_tasks`` for tasks, ``scans``, ``workers``, ``organizations``.
The Gateway applies these inside the command's transaction; ``replay rebuild`` applies the
very same changes to a fresh schema.

Replay applies events in ``notification_id`` order. That order respects every stream's version
order (appends to one stream are serialised by its row lock, and the id is drawn at insert
time), and each row is written by one stream only, except for guarded changes that commute.
Keep it so: a projection that lets two streams overwrite the same column makes rebuilds
order-dependent.
"""

from __future__ import annotations

from functools import singledispatch
from typing import Any

from leasehold.domain import events as ev
from leasehold.domain.task import ACKNOWLEDGED_BY_WORKER, TIMEOUT_ERROR, scope_ref_of
from leasehold.projections.rows import Insert, RowOp, Update, Upsert


@singledispatch
def project(event: ev.DomainEvent, hash: bytes) -> list[RowOp]:
    """The row changes ``event`` (whose chain hash is ``hash``) makes."""
    raise TypeError(f"no projection for {type(event).__name__}")


def _head(table: str, e: ev.DomainEvent, hash: bytes, touch: bool = True, **values: Any) -> Update:
    values["version"] = e.originator_version
    values["head_hash"] = hash
    if touch:
        values["updated_at"] = e.timestamp
    return Update(table, {"id": e.originator_id}, values)


# organisations and workers -----------------------------------------------------------------


@project.register
def _(e: ev.OrganizationCreated, hash: bytes) -> list[RowOp]:
    return [Insert("organizations", {
        "id": e.originator_id, "name": e.name, "created_at": e.timestamp, "updated_at": e.timestamp,
        "version": e.originator_version, "head_hash": hash, "gateway_execution": True, "target_policy": None,
        "fair_weight": 1, "max_live_attempts": None, "max_queued_tasks": None, "max_queued_scans": None,
    })]


@project.register
def _(e: ev.OrganizationGatewayExecutionSet, hash: bytes) -> list[RowOp]:
    return [_head("organizations", e, hash, gateway_execution=e.enabled)]


@project.register
def _(e: ev.OrganizationTargetPolicySet, hash: bytes) -> list[RowOp]:
    return [_head("organizations", e, hash, target_policy={"allow": list(e.allow), "deny": list(e.deny)})]


@project.register
def _(e: ev.OrganizationFairShareSet, hash: bytes) -> list[RowOp]:
    return [_head("organizations", e, hash, fair_weight=e.weight, max_live_attempts=e.max_live_attempts)]


@project.register
def _(e: ev.OrganizationAdmissionSet, hash: bytes) -> list[RowOp]:
    return [_head("organizations", e, hash, max_queued_tasks=e.max_queued_tasks, max_queued_scans=e.max_queued_scans)]


@project.register
def _(e: ev.WorkerRegistered, hash: bytes) -> list[RowOp]:
    return [Insert("workers", {
        "id": e.originator_id, "name": e.name, "fingerprint": e.fingerprint, "enabled": True,
        "revoked_at": None, "max_concurrent_tasks": e.max_concurrent_tasks,
        "capabilities": list(e.capabilities), "task_types": list(e.task_types),
        "created_at": e.timestamp, "updated_at": e.timestamp, "version": e.originator_version,
        "head_hash": hash,
    })]


@project.register
def _(e: ev.WorkerUpdated, hash: bytes) -> list[RowOp]:
    return [_head("workers", e, hash, capabilities=list(e.capabilities), task_types=list(e.task_types),
                  max_concurrent_tasks=e.max_concurrent_tasks)]


@project.register
def _(e: ev.WorkerEnabledChanged, hash: bytes) -> list[RowOp]:
    return [_head("workers", e, hash, enabled=e.enabled)]


@project.register
def _(e: ev.WorkerRevoked, hash: bytes) -> list[RowOp]:
    return [_head("workers", e, hash, enabled=False, revoked_at=e.timestamp)]


@project.register
def _(e: ev.WorkerAssigned, hash: bytes) -> list[RowOp]:
    return [
        Upsert("organization_workers", ("organization_id", "worker_id"), {
            "organization_id": e.organization_id, "worker_id": e.originator_id, "enabled": True,
            "revoked_at": None, "created_at": e.timestamp, "updated_at": e.timestamp,
        }),
        _head("workers", e, hash),
    ]


@project.register
def _(e: ev.AssignmentChanged, hash: bytes) -> list[RowOp]:
    values: dict[str, object] = {"enabled": e.enabled and not e.revoked, "updated_at": e.timestamp}
    values["revoked_at"] = e.timestamp if e.revoked else None
    return [
        Update("organization_workers", {"organization_id": e.organization_id, "worker_id": e.originator_id},
               values),
        _head("workers", e, hash),
    ]


# scans -------------------------------------------------------------------------------------


@project.register
def _(e: ev.ScanCreated, hash: bytes) -> list[RowOp]:
    return [Insert("scans", {
        "id": e.originator_id, "organization_id": e.organization_id, "status": "pending",
        "execution_mode": e.execution_mode, "targets": e.targets, "profile": None, "cancel_requested_at": None,
        "created_at": e.timestamp, "updated_at": e.timestamp, "finished_at": None,
        "version": e.originator_version, "head_hash": hash,
        "stored_profile_id": None, "legacy_scan_id": None, "legacy_message_sha256": None, "handed_over_to": None,
    })]


@project.register
def _(e: ev.ScanJobQueued, hash: bytes) -> list[RowOp]:
    return [
        Insert("scan_jobs", {
            "id": e.job_id, "scan_id": e.originator_id, "organization_id": e.organization_id, "position": e.position,
            "plugin": e.plugin, "status": "queued", "execution_mode": e.execution_mode,
            "created_at": e.timestamp, "updated_at": e.timestamp, "started_at": None, "finished_at": None,
        }),
        _head("scans", e, hash),
    ]


@project.register
def _(e: ev.ScanProfileSet, hash: bytes) -> list[RowOp]:
    # Every field of every step, lease_seconds included: later steps are created from this row.
    return [_head("scans", e, hash, profile={"steps": _profile_json(e.steps)})]


@project.register
def _(e: ev.ScanOriginRecorded, hash: bytes) -> list[RowOp]:
    return [_head("scans", e, hash, stored_profile_id=e.stored_profile_id, legacy_scan_id=e.legacy_scan_id,
                  legacy_message_sha256=e.legacy_message_sha256)]


@project.register
def _(e: ev.LegacyScanStatusRecorded, hash: bytes) -> list[RowOp]:
    if e.status in ("success", "failed", "cancelled"):
        return [_head("scans", e, hash, status=e.status, finished_at=e.timestamp)]
    return [_head("scans", e, hash, status=e.status)]


@project.register
def _(e: ev.ScanHandedOver, hash: bytes) -> list[RowOp]:
    # The legacy record's own jobs (queued by this same stream), so no other stream writes them.
    return [_head("scans", e, hash, status="cancelled", finished_at=e.timestamp, handed_over_to=e.gateway_scan_id),
            *(_job(job_id, e, "cancelled") for job_id in e.job_ids)]


@project.register
def _(e: ev.ScanCancelRequested, hash: bytes) -> list[RowOp]:
    return [_head("scans", e, hash, cancel_requested_at=e.timestamp)]


@project.register
def _(e: ev.ScanFinished, hash: bytes) -> list[RowOp]:
    return [_head("scans", e, hash, status=e.status, finished_at=e.timestamp)]


@project.register
def _(e: ev.ScanReopened, hash: bytes) -> list[RowOp]:
    return [_head("scans", e, hash, status="running", finished_at=None)]


# tasks -------------------------------------------------------------------------------------


def _job(job_id: object, e: ev.DomainEvent, status: str, *, finished: bool = True) -> Update:
    values: dict[str, object] = {"status": status, "updated_at": e.timestamp}
    if finished:
        values["finished_at"] = e.timestamp
    return Update("scan_jobs", {"id": job_id}, values)


def _attempt(attempt_id: object, **values: object) -> Update:
    return Update("worker_task_attempts", {"id": attempt_id}, values)


def _by_worker(e: ev.DomainEvent) -> bool:
    """Whether the worker itself caused ``e`` (a request it made), not the Gateway or an operator."""
    return e.actor.startswith("worker:")


def _seen(e: ev.DomainEvent, attempt_id: object, **values: object) -> Update:
    """An attempt change; when the worker caused it, also the attempt's ``last_seen_at``."""
    if _by_worker(e):
        values["last_seen_at"] = e.timestamp
    return _attempt(attempt_id, **values)


@project.register
def _(e: ev.TaskCreated, hash: bytes) -> list[RowOp]:
    return [Insert("worker_tasks", {
        "id": e.originator_id, "scan_job_id": e.scan_job_id, "scan_id": e.scan_id,
        "organization_id": e.organization_id, "task_type": e.task_type,
        "required_capabilities": list(e.required_capabilities), "priority": e.priority,
        "scope": e.scope, "parameters": e.parameters, "state": "pending", "available_at": e.available_at,
        "attempt_count": 0, "max_attempts": e.max_attempts, "lease_seconds": e.lease_seconds,
        "execution_timeout_seconds": e.execution_timeout_seconds, "current_attempt_id": None,
        "cancel_requested_at": None, "last_error": None, "created_at": e.timestamp,
        "updated_at": e.timestamp, "finished_at": None, "version": e.originator_version, "head_hash": hash,
        "cancel_delivered_at": None, "cancel_delivery_channel": None, "cancel_acknowledged_at": None,
        "scope_ref": None if (ref := scope_ref_of(e)) is None else ref.to_json(),
        "scope_pages": list(e.scope_pages) or None,  # NULL, not an empty array: a narrower row
    })]


@project.register
def _(e: ev.TaskLeased, hash: bytes) -> list[RowOp]:
    job_values: dict[str, object] = {"status": "running", "updated_at": e.timestamp}
    if e.attempt_number == 1:
        job_values["started_at"] = e.timestamp
    return [
        _head("worker_tasks", e, hash, state="leased", attempt_count=e.attempt_number,
              current_attempt_id=e.attempt_id),
        Insert("worker_task_attempts", {
            "id": e.attempt_id, "task_id": e.originator_id, "worker_id": e.worker_id,
            "attempt_number": e.attempt_number, "lease_token_hash": bytes.fromhex(e.lease_token_hash),
            "status": "leased", "leased_at": e.timestamp, "lease_expires_at": e.lease_expires_at,
            "deadline_at": e.deadline_at, "started_at": None, "finished_at": None, "batch_count": 0,
            "final_batch_accepted": False, "error": None, "acquire_request_id": e.request_id,
            "last_seen_at": e.timestamp if _by_worker(e) else None,
        }),
        Update("scan_jobs", {"id": e.scan_job_id}, job_values),
        # The first lease of any of its tasks starts the scan. This is the one change a task
        # event makes to a scan row; it sets only the status and only from 'pending', so it
        # commutes with the scan's own events (replay order cannot change the result).
        Update("scans", {"id": e.scan_id}, {"status": "running"}, guard=(("status", ("pending",)),)),
    ]


@project.register
def _(e: ev.LeaseReissued, hash: bytes) -> list[RowOp]:
    return [_head("worker_tasks", e, hash),
            _seen(e, e.attempt_id, lease_token_hash=bytes.fromhex(e.lease_token_hash))]


@project.register
def _(e: ev.TaskStarted, hash: bytes) -> list[RowOp]:
    return [_head("worker_tasks", e, hash, state="running"),
            _seen(e, e.attempt_id, status="running", started_at=e.timestamp)]


@project.register
def _(e: ev.LeaseRenewed, hash: bytes) -> list[RowOp]:
    return [_head("worker_tasks", e, hash), _seen(e, e.attempt_id, lease_expires_at=e.lease_expires_at)]


@project.register
def _(e: ev.ResultBatchAccepted, hash: bytes) -> list[RowOp]:
    return [
        _head("worker_tasks", e, hash),
        # Batches after the final one are refused, so the last accepted batch says it all.
        _seen(e, e.attempt_id, batch_count=e.sequence_number, final_batch_accepted=e.final),
        Insert("worker_result_batches", {
            "id": e.batch_id, "task_id": e.originator_id, "attempt_id": e.attempt_id,
            "sequence_number": e.sequence_number, "idempotency_key": e.idempotency_key,
            "payload_sha256": e.payload_sha256, "record_count": e.record_count, "final": e.final,
            # Ingestion runs in the acceptance transaction, so an accepted batch is persisted.
            "status": "persisted", "accepted_at": e.timestamp,
        }),
    ]


@project.register
def _(e: ev.TaskCompleted, hash: bytes) -> list[RowOp]:
    return [
        _head("worker_tasks", e, hash, state="completed", finished_at=e.timestamp),
        _seen(e, e.attempt_id, status="succeeded", finished_at=e.timestamp),
        _job(e.scan_job_id, e, "success"),
    ]


def _attempt_ended(e: ev.AttemptFailed | ev.LeaseExpired | ev.AttemptRevoked | ev.AttemptTimedOut, hash: bytes,
                   *, attempt_status: str, error: str, job_status: str) -> list[RowOp]:
    outcome = "failed_terminal" if isinstance(e, ev.AttemptTimedOut) else e.outcome
    terminal = outcome == "failed_terminal"
    task_values: dict[str, Any] = {"state": outcome, "last_error": error,
                                      "finished_at": e.timestamp if terminal else None}
    if not isinstance(e, ev.AttemptTimedOut) and e.available_at is not None:
        task_values["available_at"] = e.available_at
    ops: list[RowOp] = [
        _head("worker_tasks", e, hash, **task_values),
        _seen(e, e.attempt_id, status=attempt_status, finished_at=e.timestamp, error=error),
    ]
    if terminal:
        ops.append(_job(e.scan_job_id, e, job_status))
    return ops


@project.register
def _(e: ev.AttemptFailed, hash: bytes) -> list[RowOp]:
    return _attempt_ended(e, hash, attempt_status="failed", error=e.error, job_status=e.job_status or "failed")


@project.register
def _(e: ev.LeaseExpired, hash: bytes) -> list[RowOp]:
    return _attempt_ended(e, hash, attempt_status="expired", error="lease expired", job_status="failed")


@project.register
def _(e: ev.AttemptRevoked, hash: bytes) -> list[RowOp]:
    return _attempt_ended(e, hash, attempt_status="cancelled", error=e.reason, job_status="failed")


@project.register
def _(e: ev.AttemptTimedOut, hash: bytes) -> list[RowOp]:
    return _attempt_ended(e, hash, attempt_status="timeout", error=TIMEOUT_ERROR, job_status="timeout")


@project.register
def _(e: ev.CancelRequested, hash: bytes) -> list[RowOp]:
    return [_head("worker_tasks", e, hash, state="cancelling", cancel_requested_at=e.timestamp)]


@project.register
def _(e: ev.CancelDelivered, hash: bytes) -> list[RowOp]:
    return [_head("worker_tasks", e, hash, cancel_delivered_at=e.timestamp, cancel_delivery_channel=e.channel)]


@project.register
def _(e: ev.TaskCancelled, hash: bytes) -> list[RowOp]:
    acknowledged: dict[str, Any] = ({"cancel_acknowledged_at": e.timestamp} if e.reason == ACKNOWLEDGED_BY_WORKER
                                    else {})
    ops: list[RowOp] = [
        _head("worker_tasks", e, hash, state="cancelled", finished_at=e.timestamp, **acknowledged),
        Update("worker_tasks", {"id": e.originator_id}, {"cancel_requested_at": e.timestamp},
               guard=(("cancel_requested_at", (None,)),)),
        _job(e.scan_job_id, e, "cancelled"),
    ]
    if e.attempt_id is not None:
        ops.append(_seen(e, e.attempt_id, status="cancelled", finished_at=e.timestamp))
    return ops


@project.register
def _(e: ev.TaskRetried, hash: bytes) -> list[RowOp]:
    return [
        _head("worker_tasks", e, hash, state="pending", available_at=e.timestamp, max_attempts=e.max_attempts,
              finished_at=None),
        Update("scan_jobs", {"id": e.scan_job_id}, {"status": "queued", "updated_at": e.timestamp,
                                                    "finished_at": None}),
    ]


@project.register
def _(e: ev.WriteRejected, hash: bytes) -> list[RowOp]:
    return [_head("worker_tasks", e, hash, touch=False)]


# scheduled scans (each row written by its own schedule stream) ------------------------------


def _profile_json(steps: tuple[ev.ProfileStep, ...]) -> list[dict[str, Any]]:
    return [{"task_type": s.task_type, "required_capabilities": list(s.required_capabilities),
             "execution_timeout_seconds": s.execution_timeout_seconds, "max_attempts": s.max_attempts,
             "priority": s.priority, "stop_on_failure": s.stop_on_failure, "lease_seconds": s.lease_seconds}
            for s in steps]


@project.register
def _(e: ev.ScheduleCreated, hash: bytes) -> list[RowOp]:
    return [Insert("scheduled_scans", {
        "id": e.originator_id, "organization_id": e.organization_id, "name": e.name, "cron": e.cron,
        "interval_seconds": e.interval_seconds, "timezone": e.timezone, "targets": e.targets,
        "profile": {"steps": _profile_json(e.profile)}, "enabled": True, "misfire_policy": e.misfire_policy,
        "next_run_at": e.next_run_at, "last_run_at": None, "deleted_at": None,
        "created_at": e.timestamp, "updated_at": e.timestamp, "version": e.originator_version, "head_hash": hash,
    })]


@project.register
def _(e: ev.ScheduleEnabledChanged, hash: bytes) -> list[RowOp]:
    return [_head("scheduled_scans", e, hash, enabled=e.enabled, next_run_at=e.next_run_at)]


@project.register
def _(e: ev.ScheduleDeleted, hash: bytes) -> list[RowOp]:
    return [_head("scheduled_scans", e, hash, enabled=False, deleted_at=e.timestamp)]


@project.register
def _(e: ev.ScheduleFired, hash: bytes) -> list[RowOp]:
    return [_head("scheduled_scans", e, hash, next_run_at=e.next_run_at, last_run_at=e.timestamp)]


@project.register
def _(e: ev.ScheduleSkipped, hash: bytes) -> list[RowOp]:
    return [_head("scheduled_scans", e, hash, next_run_at=e.next_run_at)]


# stored profiles (each row written by its own profile stream) --------------------------------


@project.register
def _(e: ev.ProfileStored, hash: bytes) -> list[RowOp]:
    return [Insert("stored_profiles", {
        "id": e.originator_id, "organization_id": e.organization_id, "name": e.name,
        "profile": {"steps": _profile_json(e.steps)}, "gateway_execution": e.gateway_execution,
        "deleted_at": None, "created_at": e.timestamp, "updated_at": e.timestamp,
        "version": e.originator_version, "head_hash": hash,
    })]


@project.register
def _(e: ev.ProfileReplaced, hash: bytes) -> list[RowOp]:
    return [_head("stored_profiles", e, hash, profile={"steps": _profile_json(e.steps)})]


@project.register
def _(e: ev.ProfileGatewayExecutionSet, hash: bytes) -> list[RowOp]:
    return [_head("stored_profiles", e, hash, gateway_execution=e.enabled)]


@project.register
def _(e: ev.ProfileDeleted, hash: bytes) -> list[RowOp]:
    return [_head("stored_profiles", e, hash, deleted_at=e.timestamp)]
