"""Fixtures shared by the worker agent tests and the failure-table tests (imported by their
``conftest.py``): a real Gateway per test (real TLS, real PostgreSQL) whose retry backoff is
short, and a directory for test plugins. The session PKI is the root ``conftest.py``'s."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from leasehold.gateway.tls import PkiPaths
from support.agent import FAST_RETRIES
from support.gateway import RunningGateway, running_gateway


@pytest.fixture
async def gateway(database_url: str, pki: PkiPaths) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, pki) as gw:
        gw.lifecycle.retry_policy = FAST_RETRIES
        yield gw


@pytest.fixture
def plugins_dir(tmp_path: Path) -> Path:
    path = tmp_path / "plugins"
    path.mkdir()
    return path
