"""``replay rebuild``: every projection rebuilt from the log into a fresh schema.

The log is read and folded (:mod:`replay.fold`) in one read-only ``REPEATABLE READ`` snapshot on
the ``source`` connection; the result is bulk-loaded with COPY on the ``target`` connection in a
single transaction, so the schema appears complete or not at all. Tables are created
``LIKE public.<table> INCLUDING DEFAULTS INCLUDING CONSTRAINTS`` (checks and NOT NULL, no foreign
keys) and get their primary keys after the load. The schema is marked with a comment; only a
schema bearing that mark can be replaced, and never ``public`` or a system schema.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.types.json import JsonbBinaryDumper

from projections.memory import MemoryTables
from projections.rows import PRIMARY_KEYS, TABLE_ORDER
from replay.fold import Folded, Progress, fold
from replay.gcpause import gc_paused
from replay.snapshot import snapshot

MARK = "leasehold replay rebuild"
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class RebuildError(Exception):
    """The rebuild was refused (bad or existing schema); nothing was changed."""


@dataclass(slots=True)
class Rebuilt:
    schema: str
    events: int
    rows: dict[str, int] = field(default_factory=dict)
    fold_seconds: float = 0.0
    load_seconds: float = 0.0
    snapshot_time: datetime | None = None


def check_schema_name(schema: str) -> None:
    """Refuse ``public``, system schemas and anything that is not a plain lower-case identifier."""
    if not _NAME.match(schema):
        raise RebuildError(f"schema name {schema!r} must match {_NAME.pattern}")
    if schema == "public" or schema.startswith("pg_") or schema == "information_schema":
        raise RebuildError(f"refusing to rebuild into {schema!r}: choose a fresh schema name")


async def rebuild_schema(source: AsyncConnection[Any], target: AsyncConnection[Any], schema: str, *,
                         replace: bool = False, progress: Progress | None = None,
                         on_load: Callable[[str, int], None] | None = None) -> Rebuilt:
    """Fold the log on ``source`` and load the projections into ``schema`` on ``target``."""
    check_schema_name(schema)
    async with target.transaction():  # fail before the (long) fold when the answer is already no
        await _check_target(target, schema, replace)
    async with snapshot(source):
        cur = await source.execute("SELECT now(), (SELECT max(notification_id) FROM events)")
        row = await cur.fetchone()
        assert row is not None
        taken_at, last_id = row
        folded = await fold(source, progress=progress)
    result = Rebuilt(schema, folded.events, fold_seconds=folded.seconds, snapshot_time=taken_at)
    started = time.perf_counter()
    with gc_paused():
        await _load(target, schema, replace, folded, last_id, taken_at, result, on_load)
    result.load_seconds = time.perf_counter() - started
    return result


async def _load(target: AsyncConnection[Any], schema: str, replace: bool, folded: Folded, last_id: int | None,
                taken_at: datetime, result: Rebuilt, on_load: Callable[[str, int], None] | None) -> None:
    async with target.transaction():
        # A rebuild is derived data: its commit need not wait for the WAL flush. A crash right
        # after it loses the whole rebuild (never part of it), and it is simply run again.
        await target.execute("SET LOCAL synchronous_commit = off")
        await _create_schema(target, schema, replace)
        for table in TABLE_ORDER:
            result.rows[table] = await _copy_table(target, schema, table, folded.tables)
            if on_load is not None:
                on_load(table, result.rows[table])
        comment = (f"{MARK}: {folded.events} events up to notification_id {last_id or 0},"
                   f" snapshot at {taken_at.isoformat()}")
        await target.execute(sql.SQL("COMMENT ON SCHEMA {} IS {}").format(
            sql.Identifier(schema), sql.Literal(comment)))


async def _check_target(conn: AsyncConnection[Any], schema: str, replace: bool) -> bool:
    """Whether ``schema`` exists; raises when it does and may not be replaced."""
    cur = await conn.execute(
        "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s", (schema,))
    row = await cur.fetchone()
    if row is None:
        return False
    if not replace:
        raise RebuildError(f"schema {schema!r} already exists (use --replace to overwrite a previous rebuild)")
    if not (row[0] or "").startswith(MARK):
        raise RebuildError(f"schema {schema!r} exists and was not made by replay rebuild; refusing to drop it")
    return True


async def _create_schema(conn: AsyncConnection[Any], schema: str, replace: bool) -> None:
    ident = sql.Identifier(schema)
    # Checked again inside the transaction that drops it: it may have changed since.
    if await _check_target(conn, schema, replace):
        await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(ident))
    await conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
    for table in TABLE_ORDER:
        await conn.execute(sql.SQL(
            "CREATE TABLE {}.{} (LIKE public.{} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(
            ident, sql.Identifier(table), sql.Identifier(table)))


async def _copy_table(conn: AsyncConnection[Any], schema: str, table: str, tables: MemoryTables) -> int:
    """Binary COPY of one table's rows (the column types come from the new table itself), then
    its primary key (building the index once, after the load, is cheaper than row by row)."""
    rows = tables.tables[table]
    if rows:
        columns = list(next(iter(rows.values())))
        values = itemgetter(*columns) if len(columns) > 1 else (lambda row: (row[columns[0]],))
        cur = await conn.execute(
            "SELECT a.attname, a.atttypid FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped", (schema, table))
        types = dict(await cur.fetchall())
        statement = sql.SQL("COPY {}.{} ({}) FROM STDIN (FORMAT BINARY)").format(
            sql.Identifier(schema), sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns)))
        async with conn.cursor() as copy_cur, copy_cur.copy(statement) as copy:
            copy_cur.adapters.register_dumper(dict, JsonbBinaryDumper)  # jsonb columns hold dicts
            copy.set_types([types[c] for c in columns])
            for row in rows.values():
                await copy.write_row(values(row))
    await conn.execute(sql.SQL("ALTER TABLE {}.{} ADD PRIMARY KEY ({})").format(
        sql.Identifier(schema), sql.Identifier(table),
        sql.SQL(", ").join(map(sql.Identifier, PRIMARY_KEYS[table]))))
    return len(rows)
