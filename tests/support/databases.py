"""The per-test databases: a migrated template per migration set, and copies of it for each test.

Template: ``leasehold_tmpl_<hash of migrations/versions>``, created once and migrated to head;
reused while the migrations are unchanged. Templates of other hashes are dropped (unless another
run used them within the last hour). Creation is serialised across concurrent pytest runs with
``pg_advisory_lock``; test databases orphaned by killed runs on this host are dropped.

``tests/conftest.py`` turns these into the ``database_url``, ``make_database`` and
``empty_database_url`` fixtures.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import socket
import time
from typing import Any

import psycopg
from psycopg import sql

from leasehold.cli.embedded import with_database
from leasehold.migrations import runner as migrate

__all__ = ["TEMPLATE_PREFIX", "TEST_DB_PREFIX", "TestDatabases", "ensure_template", "migrations_hash"]

logger = logging.getLogger("tests.databases")

TEMPLATE_PREFIX = "leasehold_tmpl_"
TEST_DB_PREFIX = "t_"
#: pg_advisory_lock key serialising template (re)creation across concurrent pytest runs.
TEMPLATE_LOCK_KEY = 0x1EA5E401D_7E57
#: Templates of other migration hashes used this recently (seconds) are left alone.
STALE_TEMPLATE_GRACE_S = 3600
_HOST = socket.gethostname()


def migrations_hash() -> str:
    """Short hash of the contents (and names) of every file under ``migrations/versions``."""
    versions = migrate.MIGRATIONS_DIR / "versions"
    digest = hashlib.sha256()
    if versions.is_dir():
        for path in sorted(versions.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
                continue
            digest.update(path.relative_to(versions).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class TestDatabases:
    """Creates and drops the per-test databases on one server (autocommit admin connection).

    Each test gets a database of its own: ``CREATE DATABASE … TEMPLATE`` writes the template's
    450 files anew, and ``DROP DATABASE`` first discards the database's pages, then forces a
    checkpoint. Both stay in the test's own setup and teardown, in that order, on purpose: a
    database that lives across a checkpoint has its 450 files fsynced. Making the next test's
    database ahead, or dropping behind in a thread, lets it live across the previous drop's
    checkpoint; measured on this box, a module of 123 short tests then took 316 s instead of 216 s.

    The per-test databases run with ``synchronous_commit = off``: a commit does not wait for its
    WAL flush (2–25 ms here, depending on the load). That changes nothing a test can see unless
    the server crashes, and the tests that crash a server (``owned_pg_server``, ``tests/replicas``)
    use servers of their own, with full durability.
    """

    __test__ = False  # not a test class

    def __init__(self, server_url: str, template: str) -> None:
        self.server_url = server_url
        self.template = template
        self.tag = f"leasehold-test host={_HOST} pid={os.getpid()}"
        self._conn: psycopg.Connection[Any] | None = None

    def execute(self, query: sql.Composable | str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement on the maintenance database, reconnecting once if the server restarted."""
        for attempt in (1, 2):
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = psycopg.connect(self.server_url, autocommit=True)
            try:
                cur = self._conn.execute(query, params)
                return cur.fetchall() if cur.description else []
            except psycopg.OperationalError:
                if attempt == 2 or not (self._conn.closed or self._conn.broken):
                    raise
                self._conn = None
        raise AssertionError("unreachable")

    def create(self, *, migrated: bool = True) -> tuple[str, str]:
        """Create a fresh database (a copy of the template, or empty); return ``(name, url)``."""
        name = f"{TEST_DB_PREFIX}{secrets.token_hex(6)}"
        source = self.template if migrated else "template0"
        create = sql.SQL("CREATE DATABASE {} TEMPLATE {}")
        try:
            self.execute(create.format(sql.Identifier(name), sql.Identifier(source)))
        except psycopg.errors.InvalidCatalogName:
            if not migrated:
                raise
            # Another run (with other migrations) dropped our template: rebuild it, retry once.
            self.template = ensure_template(self.server_url)
            self.execute(create.format(sql.Identifier(name), sql.Identifier(self.template)))
        self.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(name), sql.Literal(self.tag))
        )
        self.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(sql.Identifier(name)))
        return name, with_database(self.server_url, name)

    def drop(self, name: str) -> None:
        """Drop a database, terminating any connection still open to it."""
        self.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def drop_orphans(self) -> None:
        """Drop test databases left behind by dead pytest processes on this host."""
        rows = self.execute(
            "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database WHERE datname LIKE %s",
            (TEST_DB_PREFIX.replace("_", r"\_") + "%",),
        )
        prefix = f"leasehold-test host={_HOST} pid="
        for name, comment in rows:
            if comment and comment.startswith(prefix):
                pid = comment[len(prefix) :]
                if pid.isdigit() and not _pid_alive(int(pid)):
                    logger.info("dropping orphaned test database %s (%s)", name, comment)
                    self.drop(name)

    def close(self) -> None:
        """Close the admin connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _drop_database(conn: psycopg.Connection[Any], name: str) -> None:
    ident = sql.Identifier(name)
    conn.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE false").format(ident))
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


def ensure_template(server_url: str) -> str:
    """Create (or reuse) the migrated template database for the current migrations; return its name.

    Templates of other migration hashes are dropped unless another run used them within
    :data:`STALE_TEMPLATE_GRACE_S` (so concurrent runs from other checkouts keep theirs).
    """
    name = f"{TEMPLATE_PREFIX}{migrations_hash()}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (TEMPLATE_LOCK_KEY,))
        try:
            rows = conn.execute(
                """SELECT datname, coalesce(substring(shobj_description(oid, 'pg_database')
                                                      FROM 'last-used=([0-9.]+)')::float8, 0)
                                   < extract(epoch FROM now()) - %s
                   FROM pg_database WHERE datname LIKE %s""",
                (STALE_TEMPLATE_GRACE_S, TEMPLATE_PREFIX.replace("_", r"\_") + "%"),
            ).fetchall()
            existing = {row[0] for row in rows}
            for other, unused in sorted(rows):
                if other != name and (unused or other.endswith("_building")):
                    logger.info("dropping stale template database %s", other)
                    _drop_database(conn, other)
            if name not in existing:
                started = time.perf_counter()
                building = f"{name}_building"
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(building))
                )
                migrate.upgrade(with_database(server_url, building), "head")
                conn.execute(
                    sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                        sql.Identifier(building), sql.Identifier(name)
                    )
                )
                conn.execute(
                    sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false").format(
                        sql.Identifier(name)
                    )
                )
                logger.info("created template database %s in %.2fs", name, time.perf_counter() - started)
            (now,) = conn.execute("SELECT extract(epoch FROM now())::text").fetchone() or ("0",)
            conn.execute(
                sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                    sql.Identifier(name), sql.Literal(f"leasehold test template last-used={now}")
                )
            )
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (TEMPLATE_LOCK_KEY,))
    return name
