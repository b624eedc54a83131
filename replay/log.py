"""Which streams an audit of one task or one scan reads (their rows come from
:mod:`persistence.event_log`, every stored column).

Streams are found from the log itself wherever it can say: a scan's tasks are the tasks of the
jobs its ``ScanJobQueued`` events queued (looked up through the unique ``scan_job_id`` index),
plus any task the projection files under the scan, so a tampered projection cannot hide one.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from leasehold.domain.events import ScanJobQueued
from leasehold.persistence.event_log import StoredRow, stream_rows, stream_type
from leasehold.persistence.transaction import Reader


async def scan_task_ids(conn: AsyncConnection[Any], scan_id: UUID,
                        scan_rows: list[StoredRow] | None = None) -> list[UUID]:
    """The tasks of a scan: through the jobs its events queued, and through the projection."""
    rows = scan_rows if scan_rows is not None else await stream_rows(conn, scan_id)
    job_ids = [e.job_id for e in (r.decode() for r in rows) if isinstance(e, ScanJobQueued)]
    found = await Reader(conn).all("tasks_of_scan", {"job_ids": job_ids, "scan_id": scan_id})
    return [r[0] for r in found]


class NotFound(LookupError):
    """The log has no stream with that id (or not of the expected kind)."""


async def require_stream(conn: AsyncConnection[Any], originator_id: UUID, expected: str) -> None:
    """Raise :class:`NotFound` unless ``originator_id`` is a stream whose first event is ``expected``."""
    found = await stream_type(conn, originator_id)
    if found is None:
        raise NotFound(f"no events for {originator_id}")
    if found != expected:
        raise NotFound(f"{originator_id} is a {found} stream, not a {expected} stream")
