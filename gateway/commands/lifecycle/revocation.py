"""The task lifecycle: revocation: ending a revoked or disabled worker's live attempts."""

from __future__ import annotations

from functools import partial
from uuid import UUID

from leasehold.domain.events import DomainEvent
from leasehold.domain.task import (
    RequestCancel,
    RevokeAttempt,
    decide,
)
from leasehold.gateway.commands.lifecycle.base import LifecycleBase, _lock_task_and_read
from leasehold.persistence.task_rows import task_from_row
from leasehold.persistence.transaction import Transaction


class Revocation(LifecycleBase):
    """Revocation: ending a revoked or disabled worker's live attempts (part of :class:`Lifecycle`)."""

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
            targets = [(r.task_id, r.attempt_id) for r in await reader.all(
                "worker_attempts_to_cancel", {"worker_id": worker_id, "organization_id": organization_id,
                                              "include_cancelling": at_once})]
        changed: list[UUID] = []
        for task_id, attempt_id in targets:
            command = RevokeAttempt(attempt_id, reason) if at_once else RequestCancel(reason=reason)
            events = await self.db.run(partial(self._end_live_attempt, task_id=task_id, attempt_id=attempt_id,
                                               command=command, actor=actor))
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
        events = decide(task, command, now=row.now, actor=actor,
                        draw=self.rng.random(), retry_policy=self.retry_policy)
        _, settled = await self._commit(tx, task, head, events, row.now)
        return [*events, *settled]

