"""The worker API's bodies as the Gateway fills them: the messages themselves are
:mod:`protocol.wire` (one definition, shared with the agent; the OpenAPI document is built from
them); here are the builders from the server's state."""

from __future__ import annotations

from leasehold.domain.scopes import ScopeRef
from leasehold.domain.task import AttemptState, TaskState
from leasehold.gateway.commands.lifecycle import Acquired
from leasehold.protocol.wire import (
    AcquireRequest,
    AcquireResponse,
    AttemptView,
    BatchAck,
    CancelNotice,
    CompleteRequest,
    CompleteResponse,
    FailRequest,
    FinalBatch,
    Lease,
    RenewResponse,
    ResultBatchRequest,
    ScopePageRequest,
    ScopePageView,
    ScopeRefView,
    TargetPolicyView,
    TaskStatus,
    TaskView,
    WorkerWriteRequest,
)

__all__ = [
    "AcquireRequest",
    "AcquireResponse",
    "AttemptView",
    "BatchAck",
    "CancelNotice",
    "CompleteRequest",
    "CompleteResponse",
    "FailRequest",
    "FinalBatch",
    "Lease",
    "RenewResponse",
    "ResultBatchRequest",
    "ScopePageRequest",
    "ScopePageView",
    "ScopeRefView",
    "TargetPolicyView",
    "TaskStatus",
    "TaskView",
    "WorkerWriteRequest",
    "attempt_view",
    "lease",
    "scope_ref_view",
    "task_status",
    "task_view",
]


def attempt_view(a: AttemptState) -> AttemptView:
    return AttemptView(id=a.id, attempt_number=a.attempt_number, status=a.status, leased_at=a.leased_at,
                       lease_expires_at=a.lease_expires_at, deadline_at=a.deadline_at, started_at=a.started_at,
                       finished_at=a.finished_at, batch_count=a.batch_count,
                       final_batch_accepted=a.final_batch_accepted, error=a.error)


def scope_ref_view(ref: ScopeRef) -> ScopeRefView:
    return ScopeRefView(sha256=ref.sha256, bytes=ref.size, assets=ref.assets, pages=ref.pages, omitted=ref.omitted)


def task_view(t: TaskState) -> TaskView:
    return TaskView(id=t.id, scan_id=t.scan_id, scan_job_id=t.scan_job_id, task_type=t.task_type, state=t.state,
                    priority=t.priority, scope=t.scope,
                    scope_ref=None if t.scope_ref is None else scope_ref_view(t.scope_ref),
                    parameters=t.parameters, attempt_count=t.attempt_count,
                    max_attempts=t.max_attempts, lease_seconds=t.lease_seconds,
                    execution_timeout_seconds=t.execution_timeout_seconds,
                    cancel_requested=t.cancel_requested_at is not None and t.state in ("cancelling", "cancelled"),
                    last_error=t.last_error)


def task_status(t: TaskState) -> TaskStatus:
    """The task and attempt state every worker-write answer carries."""
    return TaskStatus(task=task_view(t), attempt=attempt_view(t.current_attempt) if t.current_attempt else None)


def lease(a: Acquired) -> Lease:
    return Lease(task=task_view(a.task), attempt=attempt_view(a.attempt), attempt_id=a.attempt.id,
                 lease_token=a.lease_token, lease_expires_at=a.attempt.lease_expires_at,
                 deadline_at=a.attempt.deadline_at, target_policy=TargetPolicyView(**(a.target_policy or {})))
