"""Fixtures for replica tests: several real ``leasehold gateway serve`` processes on one database.

``cluster(url, n, **settings)`` starts ``n`` Gateway processes (distinct ports, the same
database) and gives a :class:`Cluster`: the processes, a :class:`RunningGateway` view of each
(workers over mTLS, operator calls) and a pool, registry and lifecycle of the test's own for
setup and for checking the database. Everything is stopped at teardown.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from replicas_support import Cluster

from leasehold.gateway.commands.lifecycle import TaskSpec
from leasehold.gateway.services import build_services
from leasehold.gateway.tls import PkiPaths
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database
from support.gateway import LOOPBACK_ALLOWED, GatewayProcess


@pytest.fixture
async def cluster(pki: PkiPaths, tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Cluster]]]:
    """Factory: ``await cluster(url, n, **settings)`` starts ``n`` Gateways on ``url``; every
    process (running or not) and session is stopped at teardown."""
    made: list[Cluster] = []

    async def make(url: str, n: int, **settings: Any) -> Cluster:
        pool = create_pool(url, min_size=1, max_size=10)
        await pool.open()
        services = build_services(Database(pool))
        org = await services.registry.create_organization(f"org-{uuid.uuid4().hex[:12]}")
        await services.registry.set_target_policy(org, LOOPBACK_ALLOWED)  # the test hosts are local
        scan = await services.scans.create_scan(org, {"targets": ["127.0.0.1"]})
        # A job no worker takes keeps the scan open, so tasks can be added to it all along.
        await services.lifecycle.create_task(scan, TaskSpec(task_type="hold", lease_seconds=30,
                                                   execution_timeout_seconds=600))
        gateways = [GatewayProcess(url, pki, tmp_path / f"gateway-{len(made)}-{i}.log", dict(settings))
                    for i in range(n)]
        c = Cluster(url, pool, services, org, scan, gateways)
        made.append(c)
        await asyncio.gather(*(g.start() for g in gateways))
        c.views = [g.client(services, org, scan) for g in gateways]
        return c

    yield make
    for c in made:
        for view in c.views:
            for session in view.sessions:
                await session.close()
        await asyncio.gather(*(g.stop() for g in c.gateways if g.proc is not None))
        await c.pool.close()
