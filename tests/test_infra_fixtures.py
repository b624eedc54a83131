"""The shared database fixtures from ``tests/conftest.py`` behave as documented, and a recycled
database is in the state of a fresh copy of the template."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from leasehold.gateway.services import build_services
from leasehold.migrations import runner as migrate
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database
from support.databases import TestDatabases, schema_fingerprint
from support.gateway import LOOPBACK_ALLOWED


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
    return {row[0] for row in rows}


def test_database_url_is_a_fresh_database_at_head(database_url: str, template_database: str) -> None:
    assert template_database.startswith("leasehold_tmpl_")
    assert migrate.current(database_url) == migrate.head()
    with psycopg.connect(database_url) as conn:
        name = conn.execute("SELECT current_database()").fetchone()
    assert name is not None and name[0].startswith("t_")


def test_make_database_returns_independent_databases(
    database_url: str, make_database: Callable[..., str]
) -> None:
    first, second = make_database(), make_database()
    assert len({database_url, first, second}) == 3
    with psycopg.connect(first, autocommit=True) as conn:
        conn.execute("CREATE TABLE scratch_only_in_first (x int)")
    assert "scratch_only_in_first" in _tables(first)
    assert "scratch_only_in_first" not in _tables(second)
    assert migrate.current(second) == migrate.head()


def test_empty_databases_have_no_schema(empty_database_url: str, make_database: Callable[..., str]) -> None:
    assert _tables(empty_database_url) == set()
    assert migrate.current(empty_database_url) is None
    assert _tables(make_database(migrated=False)) == set()


def test_a_test_database_commits_without_waiting_for_the_wal_flush(database_url: str) -> None:
    """No test crashes the shared server, so a commit need not wait for its fsync (see
    support.databases); the servers that tests crash are their own."""
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)



# --- recycled databases (support.databases.TestDatabases) -------------------------------------------


async def _fill(url: str) -> None:
    """What a typical test writes: an organisation, a scan with its job and task, their events."""
    pool = create_pool(url, min_size=1, max_size=2)
    await pool.open()
    try:
        services = build_services(Database(pool))
        org = await services.registry.create_organization("recycled")
        await services.registry.set_target_policy(org, LOOPBACK_ALLOWED)
        await services.scans.create_scan(org, {"targets": ["127.0.0.1"]})
    finally:
        await pool.close()


def _state(url: str) -> tuple[Any, ...]:
    """Rows per table, sequences, planner statistics and the schema digest of a database."""
    with psycopg.connect(url, autocommit=True) as conn:
        counts = {}
        for (table,) in conn.execute("SELECT oid::regclass::text FROM pg_class WHERE relkind = 'r'"
                                     " AND relnamespace = 'public'::regnamespace ORDER BY 1").fetchall():
            counts[table] = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.SQL(table))).fetchone()
        sequences = conn.execute("SELECT oid::regclass::text, pg_sequence_last_value(oid) FROM pg_class"
                                 " WHERE relkind = 'S' ORDER BY 1").fetchall()
        planner = conn.execute("SELECT oid::regclass::text, relpages, reltuples, relallvisible FROM pg_class"
                               " WHERE relnamespace = 'public'::regnamespace ORDER BY 1").fetchall()
        statistics = conn.execute("SELECT count(*) FROM pg_statistic WHERE starelid >= 16384").fetchone()
        return counts, sequences, planner, statistics, schema_fingerprint(conn)


def test_a_recycled_database_is_in_the_state_of_a_fresh_copy_under_a_new_name(
        pg_server_url: str, template_database: str) -> None:
    databases = TestDatabases(pg_server_url, template_database, recycle=True)
    if not databases.recycle:
        pytest.skip("the test role is not a superuser: databases are dropped, not recycled")
    try:
        name, url = databases.checkout()
        fresh = _state(url)
        asyncio.run(_fill(url))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE")  # statistics a fresh copy does not have
            conn.execute("SELECT nextval('checkpoints_id_seq')")
            leftover = psycopg.connect(url)  # a session the test left open
        assert _state(url) != fresh
        databases.checkin(name)
        assert leftover.closed or leftover.broken or _session_ended(leftover)
        again, again_url = databases.checkout()
        assert again != name and databases.counts == {"created": 1, "recycled": 1}
        assert _state(again_url) == fresh
        with pytest.raises(psycopg.OperationalError):  # the old name leads nowhere
            psycopg.connect(url, connect_timeout=5).close()

        # A change a reset does not undo: the database is dropped, the next one is a new copy.
        with psycopg.connect(again_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE scratch_recycling (x int)")
        databases.checkin(again)
        assert databases.counts.get("dropped: NotRecyclable") == 1
        assert not databases.execute("SELECT 1 FROM pg_database WHERE datname = %s", (again,))
        third, third_url = databases.checkout()
        assert databases.counts["created"] == 2 and _state(third_url) == fresh
        databases.checkin(third)
    finally:
        databases.close()


def _session_ended(conn: psycopg.Connection[Any]) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return True
    finally:
        conn.close()
    return False
