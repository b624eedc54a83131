"""Fixtures of the security tests: one PKI per session, one running Gateway per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.pki import PkiPaths, init_pki
from support.gateway import RunningGateway, running_gateway


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PkiPaths:
    return init_pki(Path(tmp_path_factory.mktemp("security-pki")))


@pytest.fixture
async def gateway(database_url: str, pki: PkiPaths) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, pki) as gw:
        yield gw
