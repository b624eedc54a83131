"""Scans and scan jobs: the user-visible consequences of task transitions.

RFC "State ownership": ``scans.status`` (pending, running, success, failed, cancelled) and
``scan_jobs.status`` (queued, running, success, failed, timeout, cancelled) are not driven by
anyone directly; the Gateway derives them from task transitions. This module says how.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from leasehold.domain.errors import InvalidRequest, InvalidTransition
from leasehold.domain.events import (
    AttemptFailed,
    AttemptRevoked,
    AttemptTimedOut,
    DomainEvent,
    ExecutionMode,
    JobStatus,
    LeaseExpired,
    LegacyScanStatusRecorded,
    ProfileStep,
    ScanCancelRequested,
    ScanCreated,
    ScanFinished,
    ScanHandedOver,
    ScanJobQueued,
    ScanOriginRecorded,
    ScanProfileSet,
    ScanReopened,
    ScanStatus,
    TaskCancelled,
    TaskCompleted,
    TaskLeased,
    TaskRetried,
)
from leasehold.domain.limits import check_field

TERMINAL_JOB_STATUSES: frozenset[str] = frozenset({"success", "failed", "timeout", "cancelled"})
TERMINAL_SCAN_STATUSES: frozenset[str] = frozenset({"success", "failed", "cancelled"})


def job_status_after(event: DomainEvent) -> JobStatus | None:
    """The scan job status a task event implies, or None when the job status does not change."""
    match event:
        case TaskLeased():
            return "running"
        case TaskCompleted():
            return "success"
        case AttemptFailed(outcome="failed_terminal", job_status=status):
            return status or "failed"
        case LeaseExpired(outcome="failed_terminal") | AttemptRevoked(outcome="failed_terminal"):
            return "failed"
        case AttemptTimedOut():
            return "timeout"
        case TaskCancelled():
            return "cancelled"
        case TaskRetried():
            return "queued"
    return None


def scan_outcome(job_statuses: Iterable[str], *, cancel_requested: bool = False) -> ScanStatus | None:
    """The scan's final status once every job is terminal, else None.

    A scan succeeds when every job succeeded; it is cancelled when it was cancelled (or every
    job was); any failed or timed-out job fails it. Only which statuses occur matters, not how
    often, so the distinct statuses of a scan's jobs will do.
    """
    statuses = list(job_statuses)
    if not statuses or any(s not in TERMINAL_JOB_STATUSES for s in statuses):
        return None
    if cancel_requested or all(s == "cancelled" for s in statuses):
        return "cancelled"
    if all(s == "success" for s in statuses):
        return "success"
    return "failed"


def create_scan(scan_id: UUID, organization_id: UUID, targets: dict[str, Any],
                execution_mode: ExecutionMode, *, now: datetime, actor: str) -> ScanCreated:
    check_field("targets", targets)
    return ScanCreated(originator_id=scan_id, originator_version=1, timestamp=now, actor=actor,
                       organization_id=organization_id, targets=targets, execution_mode=execution_mode)


def queue_job(scan_id: UUID, version: int, status: ScanStatus, *, organization_id: UUID, job_id: UUID,
              position: int,
              plugin: str, execution_mode: ExecutionMode, now: datetime, actor: str) -> ScanJobQueued:
    if status in TERMINAL_SCAN_STATUSES:
        raise InvalidTransition(f"the scan is already {status}")
    if not plugin:
        raise InvalidRequest("plugin must not be empty")
    return ScanJobQueued(originator_id=scan_id, originator_version=version + 1, timestamp=now,
                         actor=actor, job_id=job_id, organization_id=organization_id,
                         position=position, plugin=plugin,
                         execution_mode=execution_mode)


def finish_scan(scan_id: UUID, version: int, status: ScanStatus, *, now: datetime,
                actor: str) -> ScanFinished:
    return ScanFinished(originator_id=scan_id, originator_version=version + 1, timestamp=now,
                        actor=actor, status=status)


def reopen_for_retry(scan_id: UUID, version: int, status: str, cancel_requested: bool, *, task_id: UUID,
                     reason: str, now: datetime, actor: str) -> list[ScanReopened]:
    """A task of the scan is being retried: the events the scan needs (none while it still runs;
    ``ScanReopened`` when it had failed). A cancelled scan, or one being cancelled, stays so:
    its tasks are not retried."""
    if cancel_requested or status == "cancelled":
        raise InvalidTransition("the task's scan was cancelled; its tasks are not retried")
    if status not in TERMINAL_SCAN_STATUSES:
        return []
    return [ScanReopened(originator_id=scan_id, originator_version=version + 1, timestamp=now, actor=actor,
                         task_id=task_id, reason=reason)]


MAX_PROFILE_STEPS = 50
#: The most assets a profile step's scope holds (see :func:`enrich_scope`).
MAX_SCOPE_ASSETS = 1_000_000
MAX_LEGACY_SCAN_ID = 200


def validate_steps(steps: Sequence[ProfileStep]) -> None:
    """The rules every profile's steps follow (a scan's, a schedule's, a stored profile's)."""
    if not 1 <= len(steps) <= MAX_PROFILE_STEPS:
        raise InvalidRequest(f"a profile has 1..{MAX_PROFILE_STEPS} steps")
    for step in steps:
        if not step.task_type:
            raise InvalidRequest("task_type must not be empty")
        if step.max_attempts < 1 or step.execution_timeout_seconds < 1 or not 1 <= step.lease_seconds <= 3600:
            raise InvalidRequest("max_attempts and execution_timeout_seconds must be positive, "
                                 "lease_seconds 1..3600")


def set_profile(scan_id: UUID, version: int, steps: Sequence[ProfileStep], *, now: datetime,
                actor: str) -> ScanProfileSet:
    validate_steps(steps)
    return ScanProfileSet(originator_id=scan_id, originator_version=version + 1, timestamp=now,
                          actor=actor, steps=tuple(steps))


def record_origin(scan_id: UUID, version: int, *, stored_profile_id: UUID | None, legacy_scan_id: str | None,
                  legacy_message_sha256: str | None, now: datetime, actor: str) -> list[ScanOriginRecorded]:
    """The scan's origin, when it has one (none for an inline profile or no profile)."""
    if stored_profile_id is None and legacy_scan_id is None:
        return []
    if legacy_scan_id is not None and not 1 <= len(legacy_scan_id) <= MAX_LEGACY_SCAN_ID:
        raise InvalidRequest(f"a legacy scan id has 1..{MAX_LEGACY_SCAN_ID} characters")
    return [ScanOriginRecorded(originator_id=scan_id, originator_version=version + 1, timestamp=now, actor=actor,
                               stored_profile_id=stored_profile_id, legacy_scan_id=legacy_scan_id,
                               legacy_message_sha256=legacy_message_sha256)]


def record_legacy_status(scan_id: UUID, version: int, mode: ExecutionMode, status: str, new_status: ScanStatus, *,
                         now: datetime, actor: str) -> list[LegacyScanStatusRecorded]:
    """The legacy side's report on a legacy-executed scan: ``pending`` -> ``running`` ->
    ``success``/``failed``/``cancelled`` (straight to an outcome too). Repeating the current status
    is a no-op; going back, or changing an outcome, is refused."""
    if mode != "legacy":
        raise InvalidTransition("only a legacy-executed scan takes progress reports from the legacy side")
    if new_status == status:
        return []
    if status in TERMINAL_SCAN_STATUSES:
        raise InvalidTransition(f"the scan is already {status}")
    if new_status == "pending":
        raise InvalidTransition(f"the scan is already {status}")
    return [LegacyScanStatusRecorded(originator_id=scan_id, originator_version=version + 1, timestamp=now,
                                     actor=actor, status=new_status)]


def hand_over(scan_id: UUID, version: int, mode: ExecutionMode, status: str, *, gateway_scan_id: UUID,
              job_ids: Sequence[UUID], now: datetime, actor: str) -> ScanHandedOver:
    """Retire a legacy record that never started, because the Gateway runs it (as another scan)."""
    if mode != "legacy":
        raise InvalidTransition("only a legacy-executed scan can be handed over to the Gateway")
    if status != "pending":
        raise InvalidTransition(f"the legacy scan is already {status}")
    return ScanHandedOver(originator_id=scan_id, originator_version=version + 1, timestamp=now, actor=actor,
                          gateway_scan_id=gateway_scan_id, job_ids=tuple(job_ids))


def request_cancel(scan_id: UUID, version: int, status: str, cancel_requested: bool, *, reason: str,
                   now: datetime, actor: str) -> list[ScanCancelRequested]:
    """Repeats, and cancelling a finished scan, are no-ops."""
    if cancel_requested or status in TERMINAL_SCAN_STATUSES:
        return []
    return [ScanCancelRequested(originator_id=scan_id, originator_version=version + 1, timestamp=now,
                                actor=actor, reason=reason)]


def next_step(steps: Sequence[ProfileStep], job_count: int, last_status: str | None, *,
              cancel_requested: bool) -> int | None:
    """The index of the profile step to start now, or None.

    ``job_count`` is the number of the scan's jobs and ``last_status`` the status of the last
    one (job i runs step i). The next step starts once the last one is terminal: after success,
    or after a failure of a step that is not ``stop_on_failure``. A cancelled job, or a cancel
    request, stops the profile.
    """
    if cancel_requested or job_count == 0 or job_count >= len(steps):
        return None
    if last_status == "success" or (last_status in ("failed", "timeout")
                                    and not steps[job_count - 1].stop_on_failure):
        return job_count
    return None


def enrich_scope(scope: dict[str, Any], assets: Iterable[tuple[str, str]], *,
                 max_assets: int = MAX_SCOPE_ASSETS) -> tuple[dict[str, Any], int]:
    """``scope`` plus the assets found so far under ``"assets"``, deduplicated by (kind, value), the
    scope's own first, then the found ones in order; and how many were left out.

    At most ``max_assets`` assets: a scope past that would hold the Gateway's memory and its
    worker's for too long. Those left out are counted (each once), and the count is recorded in
    the next task's ``TaskCreated`` (``scope_assets_omitted``) and shown with its scope, never
    dropped silently."""
    seen: dict[tuple[str, str], None] = {}
    left_out: set[tuple[str, str]] = set()

    def add(key: tuple[str, str]) -> None:
        if key in seen:
            return
        if len(seen) < max_assets:
            seen[key] = None
        else:
            left_out.add(key)

    for item in scope.get("assets", ()):
        if isinstance(item, dict):
            add((str(item.get("kind", "")), str(item.get("value", ""))))
    for key in assets:
        add(key)
    return {**scope, "assets": [{"kind": k, "value": v} for k, v in seen]}, len(left_out)
