"""Organisations, workers, assignments and scans: the commands that set up who may lease what."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID, uuid4

from psycopg_pool import AsyncConnectionPool

from domain import registry as rules
from domain import scan as scan_rules
from domain.errors import NotFound
from domain.events import ExecutionMode
from gateway.commands.unit_of_work import Clock, system_clock, transaction
from gateway.sql import QUERIES
from projections.store import StreamHead, append


class Registry:
    """Set-up commands. Each is one transaction; ids may be supplied or are generated."""

    def __init__(self, pool: AsyncConnectionPool, *, clock: Clock = system_clock,
                 new_id: Callable[[], UUID] = uuid4) -> None:
        self.pool, self.clock, self.new_id = pool, clock, new_id

    async def create_organization(self, name: str, *, actor: str = "system") -> UUID:
        org_id = self.new_id()
        async with transaction(self.pool) as cur:
            await cur.execute(QUERIES["clock_now"], {"now": self.clock()})
            (now,) = await _one(cur)
            event = rules.create_organization(org_id, name, now=now, actor=actor)
            await append(cur, StreamHead(org_id), [event])
        return org_id

    async def register_worker(self, *, name: str, fingerprint: str, capabilities: tuple[str, ...] = (),
                              task_types: tuple[str, ...] = (), max_concurrent_tasks: int = 1,
                              actor: str = "system") -> UUID:
        worker_id = self.new_id()
        async with transaction(self.pool) as cur:
            await cur.execute(QUERIES["clock_now"], {"now": self.clock()})
            (now,) = await _one(cur)
            event = rules.register_worker(worker_id, name=name, fingerprint=fingerprint,
                                          capabilities=capabilities, task_types=task_types,
                                          max_concurrent_tasks=max_concurrent_tasks, now=now, actor=actor)
            await append(cur, StreamHead(worker_id), [event])
        return worker_id

    async def assign_worker(self, worker_id: UUID, organization_id: UUID, *, actor: str = "system") -> None:
        async with transaction(self.pool) as cur:
            await cur.execute(QUERIES["worker_lock"], {"worker_id": worker_id})
            row = await cur.fetchone()
            if row is None:
                raise NotFound("no such worker", worker_id=str(worker_id))
            _, version, head_hash = row
            await cur.execute(QUERIES["organization_exists"], {"organization_id": organization_id,
                                                               "now": self.clock()})
            org = await cur.fetchone()
            if org is None:
                raise NotFound("no such organisation", organization_id=str(organization_id))
            now = org[1]
            event = rules.assign_worker(worker_id, version, organization_id, now=now, actor=actor)
            await append(cur, StreamHead(worker_id, version, bytes(head_hash)), [event])

    async def create_scan(self, organization_id: UUID, targets: dict[str, Any], *,
                          execution_mode: ExecutionMode = "gateway", actor: str = "system") -> UUID:
        scan_id = self.new_id()
        async with transaction(self.pool) as cur:
            await cur.execute(QUERIES["organization_exists"], {"organization_id": organization_id,
                                                               "now": self.clock()})
            row = await cur.fetchone()
            if row is None:
                raise NotFound("no such organisation", organization_id=str(organization_id))
            event = scan_rules.create_scan(scan_id, organization_id, targets, execution_mode,
                                           now=row[1], actor=actor)
            await append(cur, StreamHead(scan_id), [event])
        return scan_id


async def _one(cur: Any) -> Any:
    row = await cur.fetchone()
    assert row is not None
    return row
