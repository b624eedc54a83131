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
from typing import Any

from psycopg import AsyncConnection

from persistence.event_log import log_end
from persistence.snapshot import snapshot
from persistence.tables import (
    comment_on_schema,
    commit_without_flush_wait,
    copy_table,
    create_projection_schema,
    schema_comment,
)
from projections.rows import TABLE_ORDER
from replay.fold import Folded, Progress, fold
from replay.gcpause import gc_paused

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
        taken_at, last_id = await log_end(source)
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
        # A rebuild is derived data: a crash right after it loses the whole rebuild (never part
        # of it), and it is simply run again.
        await commit_without_flush_wait(target)
        # Checked again inside the transaction that drops it: it may have changed since.
        await create_projection_schema(target, schema, drop_existing=await _check_target(target, schema, replace))
        for table in TABLE_ORDER:
            rows = folded.tables.tables[table]
            await copy_table(target, schema, table, rows.values())
            result.rows[table] = len(rows)
            if on_load is not None:
                on_load(table, result.rows[table])
        comment = (f"{MARK}: {folded.events} events up to notification_id {last_id or 0},"
                   f" snapshot at {taken_at.isoformat()}")
        await comment_on_schema(target, schema, comment)


async def _check_target(conn: AsyncConnection[Any], schema: str, replace: bool) -> bool:
    """Whether ``schema`` exists; raises when it does and may not be replaced."""
    comment = await schema_comment(conn, schema)
    if comment is None:
        return False
    if not replace:
        raise RebuildError(f"schema {schema!r} already exists (use --replace to overwrite a previous rebuild)")
    if not comment.startswith(MARK):
        raise RebuildError(f"schema {schema!r} exists and was not made by replay rebuild; refusing to drop it")
    return True
