"""The task lifecycle: ending the tasks stored before the input limits that break them.

Migration 0022 lists in ``undeliverable_tasks`` every unfinished task whose stored scope or
parameters break today's input limits (:mod:`domain.limits`): its lease answer might not be
encodable, and the worker API encodes answers after the acquire commits. A migration cannot
append events, so the Gateway ends them, at startup before it serves, through the same path as
any Gateway command: ``RequestCancel`` with the reason :data:`UNDELIVERABLE` (a queued task is
cancelled at once, a leased one is asked to stop), its events appended and projected and its scan
settled, and the task taken off the list in the same transaction."""

from __future__ import annotations

from uuid import UUID

from leasehold.domain.events import DomainEvent
from leasehold.domain.task import RequestCancel
from leasehold.gateway.commands.lifecycle.base import UNDELIVERABLE, LifecycleBase
from leasehold.persistence.transaction import Transaction


class Undeliverable(LifecycleBase):
    """Ending the tasks migration 0022 listed (part of :class:`Lifecycle`)."""

    async def end_undeliverable(self, *, limit: int = 1000) -> list[UUID]:
        """End every listed task on the record, one transaction each; the tasks it ended (a task
        that was over already, or that another process took off the list first, is not among them)."""
        ended: list[UUID] = []
        while True:
            async with self.db.read() as reader:
                listed = [r.task_id for r in await reader.all("undeliverable_tasks_listed", {"limit": limit})]
            if not listed:
                return ended
            for task_id in listed:
                if await self._end_undeliverable(task_id):
                    ended.append(task_id)

    async def _end_undeliverable(self, task_id: UUID) -> bool:
        async def body(tx: Transaction) -> list[DomainEvent]:
            if await tx.one("undeliverable_task_unlist", {"task_id": task_id}) is None:
                return []  # another process took it off the list
            # A task over, or already being cancelled, decides no events (a repeated cancel is a no-op).
            _, events = await self._decide_locked(tx, task_id, RequestCancel(reason=UNDELIVERABLE), "gateway")
            return events

        events = await self.db.run(body)
        self.observe(events)
        return bool(events)
