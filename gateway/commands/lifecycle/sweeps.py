"""The task lifecycle: the sweeper's steps: expired leases, passed deadlines, overdue cancellations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from leasehold.domain.events import DomainEvent
from leasehold.domain.task import (
    ExceedDeadline,
    ExpireLease,
    TaskState,
    TerminateCancelling,
    decide,
)
from leasehold.gateway.commands.lifecycle.base import LifecycleBase, release_attempts
from leasehold.persistence.task_rows import task_from_row


class Sweeps(LifecycleBase):
    """The sweeper's steps: expired leases, passed deadlines, overdue cancellations (part of :class:`Lifecycle`)."""

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

    async def clear_queue_flags(self, *, limit: int = 1000) -> int:
        """Keep the queued-work flags (migration 0021): turn the raises into flags, then lower those
        of organisations with no task of that type queued any more; how many were lowered.
        Never waits for a lock; one process at a time (another one's pass is skipped)."""
        async with self.db.transaction() as tx:
            if not (await tx.value("org_queued_work_try_lock", {})).mine:
                return 0
            await tx.value("org_queued_work_take_raises", {})
            locked = await tx.all("org_queued_work_lock_flagged", {"limit": limit})
            cleared = await tx.all("org_queued_work_clear", {
                "organization_ids": [r.organization_id for r in locked], "task_types": [r.task_type for r in locked]})
            await tx.commit()
        return len(cleared)

    async def _sweep(self, query: str, params: dict[str, Any], limit: int,
                     make: Callable[[TaskState], Any]) -> int:
        changed: list[DomainEvent] = []
        swept: set[UUID] = set()
        releases: dict[UUID, int] = {}
        async with self.db.transaction() as tx:
            locked = await tx.all(query, {**params, "limit": limit, "now": self.clock()})
            # Scan order: settling a scan locks it, and every sweeper must lock scans in one order.
            ids = [r.id for r in sorted(locked, key=lambda r: (r.scan_id, r.id))]
            for task_id in ids:  # locked above; re-read each in a fresh statement snapshot
                row = await tx.one("task_read", {"task_id": task_id, "now": self.clock()})
                assert row is not None
                task, head = task_from_row(row)
                command = make(task)
                if command is None:
                    continue
                events = decide(task, command, now=row.now, actor="sweeper", draw=self.rng.random(),
                                retry_policy=self.retry_policy)
                _, settled = await self._commit(tx, task, head, events, row.now, releases)
                changed += [*events, *settled]
                swept.update(e.originator_id for e in events)
            release_attempts(tx, releases, None)
            await tx.commit()
        self.observe(changed)
        return len(swept)

