"""Fixtures for the failure-table tests: one PKI per session, a real Gateway per test (real TLS,
real PostgreSQL) whose retry backoff is short, and a directory for test plugins. Helpers are in
:mod:`support.agent`, :mod:`support.faultproxy` and :mod:`support.gateway`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.pki import PkiPaths, init_pki
from support.agent import FAST_RETRIES
from support.gateway import RunningGateway, running_gateway


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PkiPaths:
    return init_pki(Path(tmp_path_factory.mktemp("pki")))


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
