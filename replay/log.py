"""Reading the event log with every stored column, one stream or one scan's streams at a time.

Streams are found from the log itself wherever it can say: a scan's tasks are the tasks of the
jobs its ``ScanJobQueued`` events queued (looked up through the unique ``scan_job_id`` index),
plus any task the projection files under the scan, so a tampered projection cannot hide one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection, sql

from domain.events import DomainEvent, ScanJobQueued
from replay.decode import DECODE

COLUMNS = sql.SQL(", ").join([
    *map(sql.Identifier, ("notification_id", "originator_id", "originator_version", "topic", "state",
                          "recorded_at")),
    sql.SQL("{}::text").format(sql.Identifier("transaction_id")), sql.Identifier("prev_hash"),
    sql.Identifier("hash")])
_STREAM = sql.SQL("SELECT {} FROM events WHERE originator_id = %s ORDER BY originator_version").format(COLUMNS)
_STREAMS = sql.SQL("SELECT {} FROM events WHERE originator_id = ANY(%s) ORDER BY notification_id").format(COLUMNS)


@dataclass(frozen=True, slots=True)
class StoredRow:
    """One row of ``events``, every column."""

    notification_id: int
    originator_id: UUID
    originator_version: int
    topic: str
    state: bytes
    recorded_at: datetime
    transaction_id: int
    prev_hash: bytes
    hash: bytes

    @property
    def event_type(self) -> str:
        return self.topic.rpartition(":")[2]

    def decode(self) -> DomainEvent:
        return DECODE(self.originator_id, self.originator_version, self.topic, self.state)


def _row(r: tuple[Any, ...]) -> StoredRow:
    return StoredRow(r[0], r[1], r[2], r[3], bytes(r[4]), r[5], int(r[6]), bytes(r[7]), bytes(r[8]))


async def stream_rows(conn: AsyncConnection[Any], originator_id: UUID) -> list[StoredRow]:
    """Every stored event of one stream, in version order."""
    cur = await conn.execute(
        _STREAM,
        (originator_id,))
    return [_row(r) for r in await cur.fetchall()]


async def rows_of_streams(conn: AsyncConnection[Any], ids: Iterable[UUID]) -> list[StoredRow]:
    """Every stored event of the given streams, in ``notification_id`` (log) order."""
    cur = await conn.execute(
        _STREAMS,
        (list(ids),))
    return [_row(r) for r in await cur.fetchall()]


async def stream_type(conn: AsyncConnection[Any], originator_id: UUID) -> str | None:
    """The type of a stream's first event (``TaskCreated``, ``ScanCreated``…), None if unknown."""
    cur = await conn.execute(
        "SELECT topic FROM events WHERE originator_id = %s ORDER BY originator_version LIMIT 1",
        (originator_id,))
    row = await cur.fetchone()
    return None if row is None else str(row[0]).rpartition(":")[2]


async def scan_task_ids(conn: AsyncConnection[Any], scan_id: UUID,
                        scan_rows: list[StoredRow] | None = None) -> list[UUID]:
    """The tasks of a scan: through the jobs its events queued, and through the projection."""
    rows = scan_rows if scan_rows is not None else await stream_rows(conn, scan_id)
    job_ids = [e.job_id for e in (r.decode() for r in rows) if isinstance(e, ScanJobQueued)]
    cur = await conn.execute(
        "SELECT id FROM worker_tasks WHERE scan_job_id = ANY(%s) OR scan_id = %s ORDER BY created_at, id",
        (job_ids, scan_id))
    return [r[0] for r in await cur.fetchall()]


class NotFound(LookupError):
    """The log has no stream with that id (or not of the expected kind)."""


async def require_stream(conn: AsyncConnection[Any], originator_id: UUID, expected: str) -> None:
    """Raise :class:`NotFound` unless ``originator_id`` is a stream whose first event is ``expected``."""
    found = await stream_type(conn, originator_id)
    if found is None:
        raise NotFound(f"no events for {originator_id}")
    if found != expected:
        raise NotFound(f"{originator_id} is a {found} stream, not a {expected} stream")
