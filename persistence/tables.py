"""Projection tables read or written whole: every row of a schema's tables into memory (what
``replay verify`` compares), and a complete set of rows loaded into a fresh schema (what
``replay rebuild`` makes).

The statements name a schema and tables, so they are composed with :mod:`psycopg.sql`; the
tables are those of :data:`projections.rows.PRIMARY_KEYS`.
"""

from __future__ import annotations

from collections.abc import Collection
from operator import itemgetter
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.types.json import JsonbBinaryDumper

from persistence.queries import QUERIES
from projections.memory import PRIMARY_KEY_OF, Tables
from projections.rows import PRIMARY_KEYS, TABLE_ORDER, Row


async def load_tables(conn: AsyncConnection[Any], schema: str = "public") -> Tables:
    """The projection tables of ``schema`` as ``{table: {primary key: row}}``.

    Binary results (no text to parse for uuids, timestamps and arrays), and each row built with
    ``dict(zip(...))`` and keyed by the table's precomputed key function rather than a Python
    loop over every value: on a log of 1M events this read was most of ``replay verify``.
    """
    live: Tables = {}
    for table in PRIMARY_KEYS:
        key = PRIMARY_KEY_OF[table]
        cur = conn.cursor(binary=True)
        await cur.execute(sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(table)))
        assert cur.description is not None
        names = [c.name for c in cur.description]
        rows = [dict(zip(names, values, strict=True)) for values in await cur.fetchall()]
        for row in rows:
            for name, value in row.items():
                if isinstance(value, memoryview):  # not produced by psycopg 3.2+, kept for older ones
                    row[name] = bytes(value)
        live[table] = {key(row): row for row in rows}
    return live


async def schema_comment(conn: AsyncConnection[Any], schema: str) -> str | None:
    """The comment on ``schema`` (``""`` when it has none); None when there is no such schema."""
    cur = await conn.execute(
        "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s", (schema,))
    row = await cur.fetchone()
    return None if row is None else row[0] or ""


async def create_projection_schema(conn: AsyncConnection[Any], schema: str, *, drop_existing: bool) -> None:
    """Create ``schema`` (after dropping it, with everything in it, if ``drop_existing``) holding
    an empty table for every projection, ``LIKE public.<table> INCLUDING DEFAULTS INCLUDING
    CONSTRAINTS``: its checks and NOT NULLs, no foreign keys and no primary key yet
    (:func:`copy_table` adds it after the load)."""
    ident = sql.Identifier(schema)
    if drop_existing:
        await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(ident))
    await conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
    for table in TABLE_ORDER:
        await conn.execute(sql.SQL(
            "CREATE TABLE {}.{} (LIKE public.{} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(
            ident, sql.Identifier(table), sql.Identifier(table)))


async def copy_table(conn: AsyncConnection[Any], schema: str, table: str, rows: Collection[Row]) -> None:
    """Binary COPY of ``rows`` into ``schema.table`` (the column types come from the new table
    itself), then its primary key: building the index once, after the load, is cheaper than
    row by row."""
    if rows:
        columns = list(next(iter(rows)))
        values = itemgetter(*columns) if len(columns) > 1 else (lambda row: (row[columns[0]],))
        # A domain column is copied as its base type (binary COPY dumps by type, and domains
        # have no dumpers of their own).
        cur = await conn.execute(
            "SELECT a.attname, CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END"
            " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_type t ON t.oid = a.atttypid"
            " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped", (schema, table))
        types = dict(await cur.fetchall())
        statement = sql.SQL("COPY {}.{} ({}) FROM STDIN (FORMAT BINARY)").format(
            sql.Identifier(schema), sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns)))
        async with conn.cursor() as copy_cur, copy_cur.copy(statement) as copy:
            copy_cur.adapters.register_dumper(dict, JsonbBinaryDumper)  # jsonb columns hold dicts
            copy.set_types([types[c] for c in columns])
            for row in rows:
                await copy.write_row(values(row))
    await conn.execute(sql.SQL("ALTER TABLE {}.{} ADD PRIMARY KEY ({})").format(
        sql.Identifier(schema), sql.Identifier(table),
        sql.SQL(", ").join(map(sql.Identifier, PRIMARY_KEYS[table]))))


async def comment_on_schema(conn: AsyncConnection[Any], schema: str, comment: str) -> None:
    await conn.execute(sql.SQL("COMMENT ON SCHEMA {} IS {}").format(sql.Identifier(schema), sql.Literal(comment)))


async def commit_without_flush_wait(conn: AsyncConnection[Any]) -> None:
    """Let the current transaction's commit return before its WAL reaches the disk
    (``synchronous_commit = off``, for this transaction only): for derived data that a crash may
    lose whole, never in part, and that is simply made again."""
    await conn.execute("SET LOCAL synchronous_commit = off")


async def fair_share_rows(conn: AsyncConnection[Any]) -> dict[Any, tuple[float, int, int, float]]:
    """Every organisation's fair-share state as acquisition keeps it: ``{organisation: (virtual
    time, leases served, live attempts, total wait in seconds)}``."""
    cur = await conn.execute(QUERIES["org_service_all"])
    return {row[0]: (row[1], row[2], row[3], row[4]) for row in await cur.fetchall()}
