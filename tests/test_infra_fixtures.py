"""The shared database fixtures from ``tests/conftest.py`` behave as documented."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from leasehold.migrations import runner as migrate


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

