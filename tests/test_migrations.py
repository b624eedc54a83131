"""Migration tests: the revision chain is linear, and every revision's downgrade undoes its upgrade.

The stairway walks the revisions base -> head on an empty database: upgrade to a revision,
downgrade one step (the schema must match exactly what the previous revision left), upgrade
again. Finally ``downgrade base`` must leave no leasehold objects behind.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from leasehold.migrations import runner as migrate

# Each query yields (kind, description) rows; together they fingerprint the user schema: objects
# outside pg_catalog / information_schema / pg_*, not owned by an extension, alembic's table excluded.
_FINGERPRINT_QUERIES = [
    """SELECT 'schema', n.nspname FROM pg_namespace n
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'public') AND n.nspname NOT LIKE 'pg\\_%'""",
    """SELECT 'relation ' || c.relkind::text, n.nspname || '.' || c.relname
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
          AND c.relname NOT IN ('alembic_version', 'alembic_version_pkc')
          AND NOT EXISTS (SELECT 1 FROM pg_depend d
                          WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e')""",
    """SELECT 'column', n.nspname || '.' || c.relname || '.' || a.attname || ' '
               || format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
               || coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), '')
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
          AND a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
          AND c.relname <> 'alembic_version'
          AND NOT EXISTS (SELECT 1 FROM pg_depend d
                          WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e')""",
    """SELECT 'constraint', n.nspname || '.' || c.relname || '.' || con.conname || ' '
               || pg_get_constraintdef(con.oid)
        FROM pg_constraint con
        JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
          AND c.relname <> 'alembic_version'""",
    """SELECT 'index', pg_get_indexdef(i.indexrelid)
        FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
          AND c.relname <> 'alembic_version'""",
    """SELECT 'trigger', n.nspname || '.' || c.relname || '.' || t.tgname
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
          AND NOT t.tgisinternal""",
    """SELECT 'function', p.oid::regprocedure::text
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
          AND NOT EXISTS (SELECT 1 FROM pg_depend d
                          WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')""",
    """SELECT 'type ' || t.typtype::text, n.nspname || '.' || t.typname
               || coalesce(' (' || (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                                    FROM pg_enum e WHERE e.enumtypid = t.oid) || ')', '')
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
          AND t.typtype IN ('e', 'd', 'r', 'm')
          AND NOT EXISTS (SELECT 1 FROM pg_depend d
                          WHERE d.classid = 'pg_type'::regclass AND d.objid = t.oid AND d.deptype = 'e')""",
    """SELECT 'policy', n.nspname || '.' || c.relname || '.' || pol.polname
        FROM pg_policy pol JOIN pg_class c ON c.oid = pol.polrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'""",
]


def schema_fingerprint(url: str) -> set[tuple[Any, ...]]:
    """Every user-defined schema object (tables, columns, constraints, functions, ...) in ``url``."""
    rows: set[tuple[Any, ...]] = set()
    with psycopg.connect(url) as conn:
        for query in _FINGERPRINT_QUERIES:
            rows.update(conn.execute(query).fetchall())
    return rows


def user_tables(url: str) -> list[str]:
    """User tables in schema ``public`` other than ``alembic_version``."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
                 AND c.relname <> 'alembic_version' ORDER BY 1"""
        ).fetchall()
    return [row[0] for row in rows]


def _describe(diff: set[tuple[Any, ...]]) -> str:
    return "\n  ".join(f"{kind}: {what}" for kind, what in sorted(diff))


def test_revision_chain_is_linear() -> None:
    """One base, one head, each revision revising the previous one."""
    revisions = migrate.revisions()
    if not revisions:
        pytest.skip("no migration revisions yet")
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate.make_config())
    assert script.get_heads() == [revisions[-1]], "expected exactly one head"
    previous: str | None = None
    for rev in revisions:
        down = script.get_revision(rev).down_revision
        assert down == previous, f"revision {rev} revises {down!r}, expected {previous!r}"
        previous = rev
    assert migrate.head() == revisions[-1]


def test_stairway(empty_database_url: str) -> None:
    """Upgrade, downgrade one step, upgrade again — for every revision; then downgrade to base."""
    revisions = migrate.revisions()
    if not revisions:
        pytest.skip("no migration revisions yet")
    url = empty_database_url
    baseline = schema_fingerprint(url)
    previous_rev: str | None = None
    previous_schema = baseline
    for rev in revisions:
        assert migrate.upgrade(url, rev) == rev
        upgraded = schema_fingerprint(url)

        assert migrate.downgrade(url, "-1") == previous_rev
        after_down = schema_fingerprint(url)
        assert after_down == previous_schema, (
            f"downgrade of {rev} did not restore the schema of {previous_rev or 'base'}:\n"
            f"left behind:\n  {_describe(after_down - previous_schema)}\n"
            f"missing:\n  {_describe(previous_schema - after_down)}"
        )

        assert migrate.upgrade(url, rev) == rev
        assert schema_fingerprint(url) == upgraded, f"re-applying {rev} produced a different schema"
        previous_rev, previous_schema = rev, upgraded

    assert migrate.current(url) == revisions[-1]
    assert migrate.downgrade(url, "base") is None
    assert user_tables(url) == [], "downgrade to base left leasehold tables behind"
    leftover = schema_fingerprint(url) - baseline
    assert not leftover, f"downgrade to base left objects behind:\n  {_describe(leftover)}"
