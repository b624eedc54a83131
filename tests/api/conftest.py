"""Fixtures of the Gateway-over-HTTPS tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from leasehold.gateway.services import Services
from support.services import wall_clock_services


@pytest.fixture
async def live_services(database_url: str) -> AsyncIterator[Services]:
    """The service layer on the database's own clock, beside a Gateway process on the same database."""
    async with wall_clock_services(database_url) as services:
        yield services
