"""Test support for the task core: an injectable clock and a factory that builds organisations,
workers, scans and tasks in any lifecycle state through the real commands."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from leasehold.domain.results import payload_sha256
from leasehold.gateway.commands.lifecycle import Acquired, Lifecycle, TaskSpec
from leasehold.gateway.commands.registry import Registry
from leasehold.gateway.commands.scans import Scans
from leasehold.gateway.services import Services
from leasehold.persistence.chain import verify_chains
from leasehold.persistence.connection import connect
from leasehold.persistence.snapshot import snapshot
from leasehold.persistence.tables import load_tables
from leasehold.projections.compare import diff
from leasehold.replay.fold import fold


class ManualClock:
    """A clock the test moves by hand; the service passes it to SQL as ``now``."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@dataclass
class World:
    """One organisation with scans, workers and tasks, built through the real commands."""

    services: Services
    clock: ManualClock
    org: UUID
    scan: UUID
    _workers: int = 0

    @property
    def registry(self) -> Registry:
        return self.services.registry

    @property
    def lifecycle(self) -> Lifecycle:
        return self.services.lifecycle

    @property
    def scans(self) -> Scans:
        return self.services.scans

    @property
    def pool(self) -> Any:
        """The connection pool, for the test's own SQL checks."""
        return self.services.db.pool

    async def worker(self, *, capacity: int = 1, task_types: tuple[str, ...] = ("probe",),
                     capabilities: tuple[str, ...] = (), org: UUID | None = None,
                     fingerprint: str | None = None) -> UUID:
        self._workers += 1
        fingerprint = fingerprint or hashlib.sha256(uuid4().bytes).hexdigest()
        worker_id = await self.registry.register_worker(
            name=f"worker-{self._workers}", fingerprint=fingerprint, capabilities=capabilities,
            task_types=task_types, max_concurrent_tasks=capacity)
        await self.registry.assign_worker(worker_id, org or self.org)
        return worker_id

    async def task(self, *, scan: UUID | None = None, **spec: object) -> UUID:
        fields = {"task_type": "probe", "lease_seconds": 60, "execution_timeout_seconds": 600}
        fields.update(spec)
        task = await self.lifecycle.create_task(scan or self.scan, TaskSpec(**fields))  # type: ignore[arg-type]
        return task.id

    async def leased(self, worker: UUID, **spec: object) -> Acquired:
        """A task leased to ``worker`` (the only acquirable task of its scan's organisation)."""
        await self.task(**spec)
        acquired = await self.lifecycle.acquire(worker)
        assert acquired is not None
        return acquired

    async def running(self, worker: UUID, **spec: object) -> Acquired:
        a = await self.leased(worker, **spec)
        await self.lifecycle.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
        return a

    async def final_batch(self, worker: UUID, a: Acquired, records: list[object] | None = None,
                          *, key: str = "k-1", sequence: int = 1) -> object:
        records = records if records is not None else [{"type": "asset", "kind": "host", "value": "h"}]
        return await self.lifecycle.submit_batch(
            worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=sequence, idempotency_key=key,
            payload_sha256=payload_sha256(records), records=records, final=True)


async def assert_log_rebuilds_live(database_url: str) -> None:
    """Every projection folded from the event log equals the live rows (read in one snapshot),
    and every stream's hash chain is intact."""
    async with await connect(database_url) as conn:
        async with snapshot(conn):
            rebuilt = await fold(conn)
            live = await load_tables(conn)
        assert diff(live, rebuilt.tables.tables) == []
        assert await verify_chains(conn) == []


async def event_count(pool: Any) -> int:
    """How many events the log holds: a refused command must leave it unchanged."""
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM events")
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def rows(pool: Any, query: str, *params: object) -> list[tuple[Any, ...]]:
    """The rows of ``query`` (the test's own SQL, read by position: not a row of the code under
    test) on a connection of ``pool``."""
    async with pool.connection() as conn:
        cur = await conn.execute(query, params)
        return list(await cur.fetchall())


async def tenant(world: World, name: str, *workers: UUID) -> tuple[UUID, UUID]:
    """Another organisation with a scan, served by ``workers``."""
    org = await world.registry.create_organization(name)
    scan = await world.scans.create_scan(org, {"targets": ["192.0.2.10"]})
    for worker in workers:
        await world.registry.assign_worker(worker, org)
    return org, scan
