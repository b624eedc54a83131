"""``replay rebuild``: every projection rebuilt from the log into a fresh schema.

The log is read and folded (:mod:`replay.fold`, :mod:`replay.parallel`) in one read-only
``REPEATABLE READ`` snapshot on the ``source`` connection (shared by every process of a parallel
rebuild), stream group by stream group; each chunk of groups is bulk-loaded with COPY as soon as
it is folded, so memory holds one chunk, into a staging schema (``_rebuild_<random>``). One last
transaction gives the staging tables their primary keys, drops the schema being replaced and
renames the staging schema: the schema appears complete or not at all (a failed rebuild drops
its staging schema). Tables are created
``LIKE public.<table> INCLUDING DEFAULTS INCLUDING CONSTRAINTS`` (checks and NOT NULL, no foreign
keys) and get their primary keys after the load. The schema is marked with a comment; only a
schema bearing that mark can be replaced, and never ``public`` or a system schema.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from leasehold.persistence.event_log import log_end
from leasehold.persistence.snapshot import snapshot
from leasehold.persistence.tables import (
    add_primary_keys,
    comment_on_schema,
    commit_without_flush_wait,
    create_projection_schema,
    drop_schema,
    rename_schema,
    schema_comment,
)
from leasehold.replay.fold import Progress
from leasehold.replay.parallel import over_ranges

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
                         on_load: Callable[[str, int], None] | None = None, jobs: int = 1,
                         url: str | None = None) -> Rebuilt:
    """Fold the log on ``source`` and load the projections into ``schema`` on ``target``;
    ``jobs`` above 1 folds and loads in that many processes, which connect to ``url``."""
    check_schema_name(schema)
    if jobs > 1 and url is None:
        raise ValueError("a parallel rebuild needs the database url")
    async with target.transaction():  # fail before the (long) fold when the answer is already no
        await _check_target(target, schema, replace)
    # Chunks are copied as they are folded, by every process, into a staging schema of their
    # own; the staging schema gets its keys and its name in one last transaction.
    staging = f"_rebuild_{secrets.token_hex(6)}"
    async with target.transaction():
        await create_projection_schema(target, staging, drop_existing=False)
        await comment_on_schema(target, staging, f"{MARK} (in progress)")
    try:
        started = time.perf_counter()
        async with snapshot(source):
            taken_at, last_id = await log_end(source)
            if jobs > 1:
                part = await over_ranges(source, url or "", ("load", url, staging), jobs=jobs, progress=progress)
            else:
                async with target.transaction():
                    await commit_without_flush_wait(target)
                    part = await over_ranges(source, "", ("load_into", target, staging), jobs=1,
                                             progress=progress)
        fold_seconds = time.perf_counter() - started
        result = Rebuilt(schema, part.events, dict(part.rows), fold_seconds=fold_seconds, snapshot_time=taken_at)
        started = time.perf_counter()
        async with target.transaction():
            # A rebuild is derived data: a crash right after it loses the whole rebuild (never part
            # of it), and it is simply run again.
            await commit_without_flush_wait(target)
            await add_primary_keys(target, staging)
            # Checked again inside the transaction that drops it: it may have changed since.
            if await _check_target(target, schema, replace):
                await drop_schema(target, schema)
            await rename_schema(target, staging, schema)
            comment = (f"{MARK}: {part.events} events up to notification_id {last_id or 0},"
                       f" snapshot at {taken_at.isoformat()}")
            await comment_on_schema(target, schema, comment)
        if on_load is not None:
            for table, count in result.rows.items():
                on_load(table, count)
        result.load_seconds = time.perf_counter() - started
    except BaseException:
        with contextlib.suppress(Exception):  # the error that matters is the one being raised
            async with target.transaction():
                await drop_schema(target, staging)
        raise
    return result


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
