"""Projection tables read or written whole: every row of a schema's tables into memory (what
``replay verify`` compares), and a complete set of rows loaded into a fresh schema (what
``replay rebuild`` makes).

The statements name a schema and tables, so they are composed with :mod:`psycopg.sql`; the
tables are those of :data:`projections.rows.PRIMARY_KEYS`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection
from operator import itemgetter
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection, sql
from psycopg.rows import dict_row
from psycopg.types.json import JsonbBinaryDumper

from leasehold.persistence.queries import QUERIES
from leasehold.persistence.rows import execute_named
from leasehold.projections.memory import PRIMARY_KEY_OF, Tables
from leasehold.projections.rows import PRIMARY_KEYS, TABLE_ORDER, Row

#: Columns PostgreSQL computes from others of the row (stored generated columns, migration 0026):
#: index keys, not projected state, so never compared with a rebuild.
GENERATED_COLUMNS: dict[str, tuple[str, ...]] = {
    "worker_tasks": ("listed_state",),
    "worker_task_attempts": ("live", "ended_seen_at"),
    "scans": ("listed_status",),
}


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
        for generated in GENERATED_COLUMNS.get(table, ()):
            for row in rows:
                row.pop(generated, None)
        for row in rows:
            for name, value in row.items():
                if isinstance(value, memoryview):  # not produced by psycopg 3.2+, kept for older ones
                    row[name] = bytes(value)
        live[table] = {key(row): row for row in rows}
    return live


async def schema_comment(conn: AsyncConnection[Any], schema: str) -> str | None:
    """The comment on ``schema`` (``""`` when it has none); None when there is no such schema."""
    cur = await execute_named(
        conn, "SELECT obj_description(oid, 'pg_namespace') AS comment FROM pg_namespace WHERE nspname = %s",
        (schema,))
    row = await cur.fetchone()
    return None if row is None else row.comment or ""


async def create_projection_schema(conn: AsyncConnection[Any], schema: str, *, drop_existing: bool) -> None:
    """Create ``schema`` (after dropping it, with everything in it, if ``drop_existing``) holding
    an empty table for every projection, ``LIKE public.<table> INCLUDING DEFAULTS INCLUDING
    CONSTRAINTS INCLUDING GENERATED``: its checks, NOT NULLs and generated columns, no foreign
    keys and no primary key yet
    (:func:`add_primary_keys` adds them after the load)."""
    ident = sql.Identifier(schema)
    if drop_existing:
        await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(ident))
    await conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
    for table in TABLE_ORDER:
        await conn.execute(sql.SQL(
            "CREATE TABLE {}.{} (LIKE public.{} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED)").format(
            ident, sql.Identifier(table), sql.Identifier(table)))


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
    cur = await execute_named(conn, QUERIES["org_service_all"])
    return {row.organization_id: (row.virtual_time, row.served, row.live, row.waited_seconds)
            for row in await cur.fetchall()}

# --- the live rows of stream groups (bounded verification) ----------------------------------

#: The stream group each projected row belongs to (see ``events_by_group`` in
#: ``queries/events.sql``), as SQL over the row ``x`` of the table (and ``t``, its task's row,
#: for the tables that hang off a task): a scan's rows and its tasks' rows belong to the scan,
#: every other row to the stream that writes it.
GROUP_OF: dict[str, str] = {
    "organizations": "x.id",
    "workers": "x.id",
    "organization_workers": "x.worker_id",
    "stored_profiles": "x.id",
    "scans": "x.id",
    "scan_jobs": "x.scan_id",
    "worker_tasks": "x.scan_id",
    "worker_task_attempts": "t.scan_id",
    "worker_result_batches": "t.scan_id",
    "scheduled_scans": "x.id",
}


def _group_query(schema: str, table: str, where: str) -> sql.Composed:
    join: sql.Composable = sql.SQL("")
    if GROUP_OF[table].startswith("t."):
        join = sql.SQL(" LEFT JOIN {}.worker_tasks t ON t.id = x.task_id").format(sql.Identifier(schema))
    return sql.SQL("SELECT * FROM (SELECT {group} AS _group, x.* FROM {schema}.{table} x{join}) g WHERE {where}"
                   " ORDER BY _group NULLS LAST").format(
        group=sql.SQL(GROUP_OF[table]), schema=sql.Identifier(schema), table=sql.Identifier(table), join=join,
        where=sql.SQL(where))


class GroupRows:
    """One projection table's rows in stream-group order (a server-side cursor), handed out group
    range by group range: memory holds what one range of groups has, plus one fetch."""

    def __init__(self, conn: AsyncConnection[Any], schema: str, table: str, *, fetch: int = 5_000) -> None:
        self._conn, self._schema, self._table, self._fetch = conn, schema, table, fetch
        self._key = PRIMARY_KEY_OF[table]
        self._cur: Any = None
        self._buffer: list[dict[str, Any]] = []
        self._at = 0
        self._done = False
        self._next: asyncio.Future[list[dict[str, Any]]] | None = None

    async def open_range(self, lo: UUID, hi: UUID | None) -> None:
        """Rows of the groups in ``[lo, hi)``; the last range (``hi`` None) also takes the rows of no
        group (a task's attempt or batch whose task row is missing)."""
        where = "_group >= %(lo)s AND (%(hi)s::uuid IS NULL OR _group < %(hi)s) OR _group IS NULL AND %(hi)s IS NULL"
        await self._open(_group_query(self._schema, self._table, where), {"lo": lo, "hi": hi})

    async def open_groups(self, groups: list[UUID]) -> None:
        """Rows of the listed groups."""
        await self._open(_group_query(self._schema, self._table, "_group = ANY(%(groups)s::uuid[])"),
                         {"groups": groups})

    async def _open(self, query: sql.Composed, params: dict[str, Any]) -> None:
        await self.close()
        self._cur = self._conn.cursor(name=f"replay_live_{self._table}", binary=True, row_factory=dict_row)
        await self._cur.execute(query, params)
        self._buffer, self._at, self._done = [], 0, False
        self._next = asyncio.ensure_future(self._cur.fetchmany(self._fetch))

    async def until(self, bound: UUID | None) -> dict[tuple[Any, ...], Row]:
        """The next rows, up to the first of group ``bound`` or later (None: all that are left)."""
        out: dict[tuple[Any, ...], Row] = {}
        key = self._key
        while True:
            if self._at == len(self._buffer):
                if self._done:
                    return out
                # The next fetch was requested with the previous one: the server reads it while
                # the caller folds.
                assert self._next is not None
                self._buffer, self._at = await self._next, 0
                if not self._buffer:
                    self._done = True
                    return out
                self._next = asyncio.ensure_future(self._cur.fetchmany(self._fetch))
            buffer, at = self._buffer, self._at
            end = len(buffer)
            if bound is not None:
                # Rows of no group sort last and belong to no bounded range.
                while at < end and buffer[at]["_group"] is not None and buffer[at]["_group"] < bound:
                    at += 1
            else:
                at = end
            generated = GENERATED_COLUMNS.get(self._table, ())
            for row in buffer[self._at:at]:  # rows handed out: the buffer needs no _group of theirs
                del row["_group"]
                for name in generated:
                    row.pop(name, None)
                out[key(row)] = row
            self._at = at
            if at < end:
                return out

    async def close(self) -> None:
        if self._next is not None and not self._next.done():
            self._next.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._next
        self._next = None
        if self._cur is not None:
            await self._cur.close()
            self._cur = None


# --- loading a rebuild chunk by chunk --------------------------------------------------------


class TableLoader:
    """Binary COPY of row chunks into the (key-less) tables of a schema made by
    :func:`create_projection_schema`; :func:`add_primary_keys` once every chunk is in."""

    def __init__(self, conn: AsyncConnection[Any], schema: str) -> None:
        self._conn, self._schema = conn, schema
        self._types: dict[str, dict[str, int]] = {}

    async def copy(self, table: str, rows: Collection[Row]) -> None:
        if not rows:
            return
        conn, schema = self._conn, self._schema
        types = self._types.get(table)
        if types is None:
            # A domain column is copied as its base type (binary COPY dumps by type, and domains
            # have no dumpers of their own).
            cur = await conn.execute(
                "SELECT a.attname, CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END"
                " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_type t ON t.oid = a.atttypid"
                " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped", (schema, table))
            types = self._types[table] = dict(await cur.fetchall())
        columns = list(next(iter(rows)))
        first, *_ = columns
        values = itemgetter(*columns) if len(columns) > 1 else (lambda row: (row[first],))
        statement = sql.SQL("COPY {}.{} ({}) FROM STDIN (FORMAT BINARY)").format(
            sql.Identifier(schema), sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns)))
        async with conn.cursor() as copy_cur, copy_cur.copy(statement) as copy:
            copy_cur.adapters.register_dumper(dict, JsonbBinaryDumper)  # jsonb columns hold dicts
            copy.set_types([types[c] for c in columns])
            for row in rows:
                await copy.write_row(values(row))


async def add_primary_keys(conn: AsyncConnection[Any], schema: str) -> None:
    """The primary key of every projection table of ``schema``: building each index once, after
    the load, is cheaper than row by row."""
    for table in TABLE_ORDER:
        await conn.execute(sql.SQL("ALTER TABLE {}.{} ADD PRIMARY KEY ({})").format(
            sql.Identifier(schema), sql.Identifier(table),
            sql.SQL(", ").join(map(sql.Identifier, PRIMARY_KEYS[table]))))


async def rename_schema(conn: AsyncConnection[Any], old: str, new: str) -> None:
    await conn.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(sql.Identifier(old), sql.Identifier(new)))


async def drop_schema(conn: AsyncConnection[Any], schema: str) -> None:
    await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
