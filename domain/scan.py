"""Scans and scan jobs: the user-visible consequences of task transitions.

RFC "State ownership": ``scans.status`` (pending, running, success, failed, cancelled) and
``scan_jobs.status`` (queued, running, success, failed, timeout, cancelled) are not driven by
anyone directly; the Gateway derives them from task transitions. This module says how.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from uuid import UUID

from domain.errors import InvalidRequest, InvalidTransition
from domain.events import (
    AttemptFailed,
    DomainEvent,
    ExecutionMode,
    JobStatus,
    LeaseExpired,
    ScanCreated,
    ScanFinished,
    ScanJobQueued,
    ScanStatus,
    TaskCancelled,
    TaskCompleted,
    TaskLeased,
)

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
        case LeaseExpired(outcome="failed_terminal"):
            return "failed"
        case TaskCancelled():
            return "cancelled"
    return None


def scan_outcome(job_statuses: Iterable[str], *, cancel_requested: bool = False) -> ScanStatus | None:
    """The scan's final status once every job is terminal, else None.

    A scan succeeds when every job succeeded; it is cancelled when it was cancelled (or every
    job was); any failed or timed-out job fails it.
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
