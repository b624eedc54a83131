"""The unit tier: pure logic only (``domain/``, ``projections/``, the write buffer's splitting rules,
the published contract), run by ``make test-unit`` without any PostgreSQL in well under 30 s.

A test here must never reach a database, and it must not be able to do so quietly: a test whose
fixtures lead to a server (``database_url``, ``pool``, ``world``, ``gateway``…) stops the run
at collection with the names of the offending tests, and the server fixtures themselves are
replaced here by ones that fail, and so are connecting with psycopg and starting an embedded
server from inside a test. Tests that need PostgreSQL belong in the other folders of
``tests/``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import pytest
from hypothesis import settings

from leasehold.cli.embedded import EmbeddedPostgres

UNIT_DIR = Path(__file__).resolve().parent

#: ``make mutation`` judges every mutant by this tier: with this profile hypothesis draws the same
#: examples for each of them (a mutant is killed or not, never by luck) and keeps no example
#: database, which would carry one mutant's failures over to the next.
settings.register_profile("mutation", derandomize=True, database=None)
if os.environ.get("LEASEHOLD_HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["LEASEHOLD_HYPOTHESIS_PROFILE"])

#: Fixtures that start, copy or connect to a PostgreSQL server (everything else that needs a
#: database depends on one of these: ``database_url``, ``pool``, ``services``, ``world``,
#: ``gateway``…). ``pki`` is not one of them, but a unit test has no Gateway to give it to.
DATABASE_FIXTURES = frozenset({
    "pg_server_url", "embedded_pg_server", "owned_pg_server", "template_database", "_test_databases",
    "database_url", "make_database", "empty_database_url",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse the whole run when a unit test asks for a database, naming each such test."""
    offenders = []
    for item in items:
        if not item.path.is_relative_to(UNIT_DIR):
            continue
        wanted = DATABASE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if wanted:
            offenders.append(f"{item.nodeid} (via {', '.join(sorted(wanted))})")
    if offenders:
        raise pytest.UsageError(
            "unit tests must not use a database; move these to a database tier of tests/:\n  "
            + "\n  ".join(offenders))


def _no_database(what: str) -> NoReturn:
    pytest.fail(f"the unit tier has no database, and a unit test {what}; tests that need PostgreSQL "
                "belong outside tests/unit", pytrace=False)


@pytest.fixture(scope="session")
def pg_server_url() -> NoReturn:
    """Replaces the server fixture of ``tests/conftest.py`` for unit tests: it fails."""
    _no_database("asked for the pg_server_url fixture")


@pytest.fixture(scope="session")
def embedded_pg_server() -> NoReturn:
    _no_database("asked for the embedded_pg_server fixture")


@pytest.fixture(scope="module")
def owned_pg_server() -> NoReturn:
    _no_database("asked for the owned_pg_server fixture")


@pytest.fixture(autouse=True)
def _no_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A unit test that connects, or starts a server, by hand fails too (undone after each test,
    so the database tiers of the same run are untouched)."""

    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        _no_database("tried to connect to PostgreSQL or to start a server")

    monkeypatch.setattr(psycopg, "connect", refuse)
    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(refuse))
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(refuse))
    monkeypatch.setattr(EmbeddedPostgres, "start", refuse)
    yield
