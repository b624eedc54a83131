"""Bulk operations: cancel or retry every task a filter selects, as a tracked operation.

:meth:`BulkOperations.start` fixes what the operation covers (the tasks the filter selects that
exist when it starts: ``total``) and records it; a runner in every Gateway process
(:mod:`gateway.background.bulk`) then takes one running operation at a time (``bulk_claim``: a
hold of ``hold`` seconds, so a runner that died is replaced) and reaches its tasks oldest first,
each with :meth:`~gateway.commands.lifecycle.commands.TaskCommands.bulk_step`: the task's own
command (its events name the operation in their reason) and the operation's row for that task,
in one transaction, which also counts its outcome on the operation's row. A task is therefore
reached exactly once, across restarts and racing runners (the row's primary key), and
``done + skipped + failed`` counts what was reached, exactly.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import orjson

from leasehold.domain.errors import Conflict, InvalidRequest
from leasehold.gateway.commands.idempotency import IdempotencyKey, claim, created
from leasehold.gateway.commands.lifecycle import Lifecycle
from leasehold.persistence.transaction import Clock, Database, system_clock

__all__ = ["ACTIONS", "BulkOperations", "TaskFilter"]

log = logging.getLogger("leasehold.gateway")

ACTIONS = ("cancel", "retry")


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks: every field optional (None: any), as the task list filters them."""

    organization_id: UUID | None = None
    state: str | None = None
    task_type: str | None = None
    scan_id: UUID | None = None
    worker_id: UUID | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None

    def params(self) -> dict[str, Any]:
        return asdict(self)

    def stored(self) -> dict[str, Any]:
        """As stored with the operation (JSON, unset fields left out)."""
        return {k: (str(v) if isinstance(v, UUID) else v.isoformat() if isinstance(v, datetime) else v)
                for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_stored(cls, stored: dict[str, Any]) -> TaskFilter:
        return cls(**{k: stored.get(k) for k in cls.__slots__})


class BulkOperations:
    """Start, stop and run bulk operations (see the module docstring)."""

    def __init__(self, db: Database, lifecycle: Lifecycle, *, clock: Clock = system_clock,
                 new_id: Any = uuid4) -> None:
        self.db, self.lifecycle, self.clock, self.new_id = db, lifecycle, clock, new_id
        #: Set when this process starts an operation: its runner starts at once, not at its next pass.
        self.started = asyncio.Event()

    async def preview(self, selection: TaskFilter) -> int:
        """How many tasks ``selection`` selects now (what an operation started now would cover)."""
        async with self.db.read() as reader:
            found = await reader.one("bulk_matching_count", {**selection.params(), "started_at": None})
        return int(found.matched) if found is not None else 0

    async def start(self, action: str, selection: TaskFilter, *, reason: str, attempts: int | None = None,
                    actor: str, organization_id: UUID | None, idempotency: IdempotencyKey | None = None) -> UUID:
        """Record a running operation over the tasks ``selection`` selects now; its id. With
        ``idempotency``, a request already made with that key raises ``AlreadyCreated``."""
        if action not in ACTIONS:
            raise InvalidRequest(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
        if attempts is not None and action != "retry":
            raise InvalidRequest("attempts goes with the retry action only")
        operation_id = self.new_id()
        async with self.db.transaction() as tx:
            await claim(tx, idempotency, self.clock())
            created(tx, idempotency, operation_id)
            started = await tx.value("bulk_started_at", {"now": self.clock()})
            count = await tx.value("bulk_matching_count", {**selection.params(), "started_at": started.started_at})
            tx.write("bulk_operations", "bulk_insert", {
                "id": operation_id, "organization_id": organization_id, "action": action,
                "filter": orjson.dumps(selection.stored()).decode(), "reason": reason, "attempts": attempts,
                "actor": actor, "total": int(count.matched), "started_at": started.started_at})
            await tx.commit()
        self.started.set()
        return operation_id

    async def stop(self, operation_id: UUID) -> None:
        """Stop a running operation: the tasks it reached stay as they are; no further ones."""
        async with self.db.transaction() as tx:
            await tx.execute("bulk_stop", {"operation_id": operation_id, "now": self.clock()})
            await tx.commit()

    async def run_once(self, *, batch: int = 200, hold: timedelta = timedelta(seconds=60)) -> int:
        """Take one running operation no live runner holds and reach up to ``batch`` of its tasks;
        how many were reached (0: nothing to do)."""
        async with self.db.transaction() as tx:
            op = await tx.one("bulk_claim", {"now": self.clock(), "hold": hold})
            await tx.commit()
        if op is None:
            return 0
        operation_id: UUID = op.id
        stored = op.filter if isinstance(op.filter, dict) else orjson.loads(op.filter)
        selection = TaskFilter.from_stored(stored)
        reason = f"{op.reason} (bulk operation {operation_id})"
        reached, finished, after_at, after_id = 0, False, None, None
        try:
            while reached < batch and not finished:
                async with self.db.read() as reader:
                    status = await reader.one("bulk_status", {"operation_id": operation_id})
                    if status is None or status.status != "running":
                        break
                    found = await reader.all("bulk_next_tasks", {
                        **selection.params(), "started_at": op.started_at, "operation_id": operation_id,
                        "after_at": after_at, "after_id": after_id, "limit": min(50, batch - reached)})
                finished = not found
                for task in found:
                    try:
                        await self.lifecycle.bulk_step(task.task_id, operation_id=operation_id, action=op.action,
                                                       reason=reason, attempts=op.attempts, actor=op.actor)
                    except Conflict:  # another runner reached it first (the outcome's primary key)
                        log.info("bulk operation task reached by another runner",
                                 extra={"operation_id": str(operation_id), "task_id": str(task.task_id)})
                    reached += 1
                    after_at, after_id = task.created_at, task.task_id
        finally:
            await self._progress(operation_id, finished=finished, release=True)
        return reached

    async def _progress(self, operation_id: UUID, *, finished: bool, release: bool) -> None:
        async with self.db.transaction() as tx:
            await tx.execute("bulk_progress", {"operation_id": operation_id, "finished": finished,
                                               "release": release, "now": self.clock()})
            await tx.commit()
