"""The service layer on a pool of its own, on the database's clock (``now()``), for tests that
drive a Gateway in another process: what the test sets up there must be on the same clock as the
Gateway, so no ``ManualClock`` (the ``services`` fixture of ``tests/conftest.py`` has one)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from leasehold.gateway.services import Services, build_services
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database

__all__ = ["wall_clock_services"]


@asynccontextmanager
async def wall_clock_services(database_url: str, max_size: int = 4) -> AsyncIterator[Services]:
    """Services over a pool of ``max_size`` connections to ``database_url``, closed on exit."""
    pool = create_pool(database_url, min_size=1, max_size=max_size)
    await pool.open()
    try:
        yield build_services(Database(pool))
    finally:
        await pool.close()
