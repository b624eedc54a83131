"""Fixtures for the replay tests: a pool on a fresh migrated database, an injectable clock, and a
world factory (see ``support.core``) — the same pattern as ``tests/core/conftest.py``."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest

from gateway.commands import Lifecycle, Registry
from projections.connection import create_pool
from support.core import ManualClock, World


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[object]:
    pool = create_pool(database_url, min_size=1, max_size=30)
    await pool.open()
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def world(pool: object, clock: ManualClock) -> World:
    registry = Registry(pool, clock=clock)  # type: ignore[arg-type]
    lifecycle = Lifecycle(pool, clock=clock, rng=random.Random(7))  # type: ignore[arg-type]
    org = await registry.create_organization("acme")
    scan = await registry.create_scan(org, {"targets": ["127.0.0.1"]})
    return World(registry, lifecycle, clock, org, scan)
