"""Shared pytest fixtures: a PostgreSQL server, a migrated template database and per-test copies.

Server: ``$TEST_DATABASE_URL`` (a URL to a maintenance database, e.g.
``postgresql://postgres@127.0.0.1:5432/postgres``) when set, else an embedded server with data
dir ``<project root>/.leasehold/test-pgdata`` started once per session (stopped at exit when this
run started it and no other run still uses it).

Template and per-test copies: :mod:`support.databases`.

Fixtures for tests:

* ``database_url`` -> ``str``: a database migrated to head in the template's state: a copy
  (``CREATE DATABASE t_<random> TEMPLATE <template>``), or one an earlier test of this process used,
  reset and renamed; after the test it is reset for the next one, or dropped ``WITH (FORCE)``
  when the test changed what a reset does not restore (:class:`support.databases.TestDatabases`).
* ``make_database`` -> ``Callable[..., str]``: ``make_database()`` returns another fresh migrated
  database URL, ``make_database(migrated=False)`` an empty one; all dropped at teardown.
* ``empty_database_url`` -> ``str``: a fresh, EMPTY database (from ``template0``) for migration tests.
* ``pg_server_url`` (session) -> ``str``: URL of the maintenance database of the test server.
* ``template_database`` (session) -> ``str``: name of the migrated template database.
* ``pki`` (session) -> ``PkiPaths``: a development CA and server certificate (``leasehold pki init``).
* ``gateway`` -> ``RunningGateway``: an in-process Gateway on real TLS over this test's database
  (:mod:`support.gateway`); the worker and failure-table tests use one with short retries.
* ``embedded_pg_server`` (session) -> ``EmbeddedPostgres``: the embedded test server (started on
  demand even when ``$TEST_DATABASE_URL`` is set).
* ``owned_pg_server`` (module) -> ``OwnedServer``: a PostgreSQL server of the test module's own
  (its own data directory and port), for tests that stop, crash (``restart("immediate")``) or
  restart a server; ``owned.database()`` gives the URL of a fresh migrated database on it.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool
from replicas.replicas_support import RedisServer

from leasehold.cli.dev_ca import init_pki
from leasehold.cli.embedded import EmbeddedPostgres, redact_url
from leasehold.gateway.services import Services, build_services
from leasehold.gateway.tls import PkiPaths
from leasehold.migrations import runner as migrate
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database
from support.core import ManualClock, World
from support.databases import TestDatabases, ensure_template
from support.gateway import LOOPBACK_ALLOWED, RunningGateway, free_port, running_gateway

# pytest-xdist's worker processes inherit COLUMNS=80/LINES=24 from their launcher; the commands under
# test size their tables by COLUMNS when stdout is not a terminal, so a run in one process and a run
# in several would print differently. Tests see what a pipe in a plain shell sees: neither set.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

REPO_ROOT = Path(__file__).resolve().parents[1]


def _project_root() -> Path:
    home = os.environ.get("LEASEHOLD_HOME")
    return Path(home).expanduser().resolve() if home else REPO_ROOT


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def embedded_pg_server() -> EmbeddedPostgres:
    """The embedded test server (``.leasehold/test-pgdata``), started once per session."""
    server = EmbeddedPostgres(_project_root() / ".leasehold" / "test-pgdata", stop_at_exit=True)
    server.start()
    return server


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PkiPaths:
    return init_pki(Path(tmp_path_factory.mktemp("pki")))


@pytest.fixture
async def gateway(database_url: str, pki: PkiPaths) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, pki) as gw:
        yield gw


class OwnedServer:
    """An embedded server no other test uses; a test may crash and restart it at will."""

    def __init__(self, server: EmbeddedPostgres) -> None:
        self.server = server
        self._count = 0

    def url(self, dbname: str = "postgres") -> str:
        return self.server.url(dbname)

    def database(self) -> str:
        """Create a fresh database on this server, migrate it to head, return its URL."""
        self._count += 1
        name = f"owned_{self._count}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        url = self.url(name)
        migrate.upgrade(url)
        return url

    def restart(self, mode: str = "immediate") -> None:
        """``pg_ctl restart -m MODE`` (``immediate``: no shutdown checkpoint, crash recovery)."""
        self.server.restart(mode)


@pytest.fixture(scope="module")
def owned_pg_server() -> Iterator[OwnedServer]:
    """A private embedded PostgreSQL for this module, stopped (immediately) and removed afterwards.

    Its data directory is not under pytest's temporary directory: a concurrent pytest run
    resets that to mode 0700, which would lock out the server's own system user."""
    base = Path(tempfile.mkdtemp(prefix="leasehold-owned-pg-"))
    base.chmod(0o755)
    server = EmbeddedPostgres(base / "pgdata")
    try:
        server.start()
        yield OwnedServer(server)
    finally:
        server.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server_url(request: pytest.FixtureRequest) -> str:
    """URL of a maintenance database on the test server (``$TEST_DATABASE_URL`` or embedded)."""
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        try:
            psycopg.connect(url, connect_timeout=10).close()
        except psycopg.Error as exc:
            pytest.exit(f"TEST_DATABASE_URL={redact_url(url)} is unreachable: {exc}", returncode=1)
        return url
    server: EmbeddedPostgres = request.getfixturevalue("embedded_pg_server")
    return server.url("postgres")


@pytest.fixture(scope="session")
def template_database(pg_server_url: str) -> str:
    """Name of the template database migrated to head (created once, reused across runs)."""
    return ensure_template(pg_server_url)


@pytest.fixture(scope="session")
def _test_databases(pg_server_url: str, template_database: str) -> Iterator[TestDatabases]:
    manager = TestDatabases(pg_server_url, template_database)
    manager.drop_orphans()
    yield manager
    manager.close()


@pytest.fixture
def database_url(_test_databases: TestDatabases) -> Iterator[str]:
    """URL of a database migrated to head, in the template's state; reset for the next test (or
    dropped) after the test (:class:`support.databases.TestDatabases`)."""
    name, url = _test_databases.checkout()
    yield url
    _test_databases.checkin(name)


@pytest.fixture
def make_database(_test_databases: TestDatabases) -> Iterator[Callable[..., str]]:
    """Factory: ``make_database(migrated=True) -> url`` of a database in the template's state (an
    empty one with ``migrated=False``); at teardown the migrated ones are reset or dropped, the
    empty ones dropped."""
    created: list[tuple[str, bool]] = []

    def make(*, migrated: bool = True) -> str:
        name, url = _test_databases.checkout() if migrated else _test_databases.create(migrated=False)
        created.append((name, migrated))
        return url

    yield make
    for name, migrated in created:
        if migrated:
            _test_databases.checkin(name)
        else:
            _test_databases.drop(name)


@pytest.fixture
def empty_database_url(_test_databases: TestDatabases) -> Iterator[str]:
    """URL of a fresh EMPTY database (no schema, no alembic_version); dropped after the test."""
    name, url = _test_databases.create(migrated=False)
    yield url
    _test_databases.drop(name)


BROWSER_TESTS = REPO_ROOT / "tests" / "browser"


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything under tests/browser is marked ``browser`` (the tiers select by marker).

    Modules with a test marked ``slow`` (tens of seconds each) run first, each keeping its order:
    with several pytest-xdist processes the longest modules are handed out first, so no process
    is left running one of them alone at the end. The order is the same in every process."""
    for item in items:
        if BROWSER_TESTS in item.path.parents:
            item.add_marker(pytest.mark.browser)
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: 0 if item.path in slow else 1)


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A private ``redis-server`` (no persistence) the test may kill; skipped without the binary."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(binary, free_port(), tmp_path)
    await server.start()
    try:
        yield server
    finally:
        await server.kill()


# --- the task core, for tests of every layer --------------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    """A clock the test moves by hand; commands pass it to SQL as ``now``."""
    return ManualClock()


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[AsyncConnectionPool]:
    """A connection pool (configured like the Gateway's) on this test's database."""
    pool = create_pool(database_url, min_size=1, max_size=40)
    await pool.open()
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
def services(pool: AsyncConnectionPool, clock: ManualClock) -> Services:
    """The service layer on this test's database, with the test's clock and a seeded random source."""
    return build_services(Database(pool), clock=clock, rng=random.Random(7))


@pytest.fixture
async def world(services: Services, clock: ManualClock) -> World:
    """One organisation and scan, and factories for workers and tasks in any state."""
    org = await services.registry.create_organization("acme")
    await services.registry.set_target_policy(org, LOOPBACK_ALLOWED)  # the test hosts are local
    scan = await services.scans.create_scan(org, {"targets": ["127.0.0.1"]})
    return World(services, clock, org, scan)
