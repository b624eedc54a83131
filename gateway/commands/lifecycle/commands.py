"""The task lifecycle: operator and Gateway commands on a task: cancel, cancel delivery, retry."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import partial
from uuid import UUID

from leasehold.domain import scan as scan_rules
from leasehold.domain.errors import Conflict, InvalidTransition, NotFound
from leasehold.domain.events import (
    CancelChannel,
    DomainEvent,
)
from leasehold.domain.task import (
    DeliverCancel,
    RequestCancel,
    RetryTask,
    TaskState,
    decide,
)
from leasehold.gateway.commands import wakeups
from leasehold.gateway.commands.lifecycle.base import LifecycleBase, _lock_task_and_read
from leasehold.persistence.event_log import StreamHead
from leasehold.persistence.task_rows import task_from_row
from leasehold.persistence.transaction import Transaction


class TaskCommands(LifecycleBase):
    """Operator and Gateway commands on a task: cancel, cancel delivery, retry (part of :class:`Lifecycle`)."""

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
                                                  channel=channel, actor=actor))
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
        events = decide(task, DeliverCancel(attempt_id, channel), now=row.now, actor=actor)
        await self._commit(tx, task, head, events, row.now)
        return task, events

    async def retry(self, task_id: UUID, *, reason: str = "retried by an operator", attempts: int | None = None,
                    actor: str = "system") -> TaskState:
        """failed_terminal -> pending with a fresh attempt budget (:class:`domain.task.RetryTask`).

        One transaction: the task's lock, then its scan's (the lifecycle's lock order). A failed
        scan is reopened (``ScanReopened``) so that it settles again when the task ends; a
        cancelled scan refuses (409), as does a task in any other state.
        """
        task, events = await self.db.run(partial(self._retry_locked, task_id=task_id, reason=reason,
                                                 attempts=attempts, actor=actor))
        self.observe(events)
        return task

    async def _retry_locked(self, tx: Transaction, *, task_id: UUID, reason: str, attempts: int | None,
                            actor: str) -> tuple[TaskState, list[DomainEvent]]:
        row = await _lock_task_and_read(tx, "task_read", {"task_id": task_id, "now": self.clock()})
        if row is None:
            raise NotFound("no such task", task_id=str(task_id))
        task, head = task_from_row(row)
        now: datetime = row.now
        events = decide(task, RetryTask(reason=reason, attempts=attempts), now=now, actor=actor)
        scan = await tx.one("scan_lock_for_orchestration", {"scan_id": task.scan_id})
        assert scan is not None, "the foreign key guarantees the scan"
        version, head_hash, org_id = scan.version, scan.head_hash, scan.organization_id
        reopened = scan_rules.reopen_for_retry(task.scan_id, version, scan.status, scan.cancel_requested,
                                               task_id=task_id, reason=reason, now=now, actor=actor)
        after, _ = await self._commit(tx, task, head, events, now)
        tx.append(StreamHead(task.scan_id, version, bytes(head_hash)), reopened)
        tx.notify(wakeups.available(org_id))
        return after, [*events, *reopened]

    async def bulk_step(self, task_id: UUID, *, operation_id: UUID, action: str, reason: str,
                        attempts: int | None, actor: str) -> str:
        """One task of a bulk operation: its cancel or retry and the operation's record of it
        (``bulk_operation_tasks``), in one transaction, so a task is reached once whatever
        happens to the runner. A task the command refuses (a retry of a task that is not
        ``failed_terminal``, a cancel of a finished one) is recorded as ``skipped`` with the reason.
        The outcome: ``done`` or ``skipped``."""
        async def body(tx: Transaction) -> tuple[str, list[DomainEvent]]:
            outcome: str = "done"
            detail: str | None = None
            events: list[DomainEvent] = []
            try:
                if action == "retry":
                    _, events = await self._retry_locked(tx, task_id=task_id, reason=reason, attempts=attempts,
                                                         actor=actor)
                else:
                    _, events = await self._decide_locked(tx, task_id, RequestCancel(reason=reason), actor)
                    if not events:
                        outcome, detail = "skipped", "already ended or cancelling"
            except (InvalidTransition, Conflict, NotFound) as refused:  # decided before any write
                outcome, detail = "skipped", refused.message
            reached = {"operation_id": operation_id, "task_id": task_id, "outcome": outcome, "detail": detail,
                       "now": self.clock()}
            tx.write("bulk_operation_tasks", "bulk_task_outcome", reached)
            tx.write("bulk_operations", "bulk_count_outcome", reached)
            return outcome, events

        outcome, events = await self.db.run(body)
        self.observe(events)
        return outcome
        task, events = await self.db.run(body)
        self.observe(events)
        return task

