"""``replay as-of``: a task or a scan as it was at a given moment.

A stream's events up to the moment are folded: for a task with :func:`domain.task.project_task`
(its state, attempt and lease times), for a scan with the Gateway's projector over the scan's
stream and its tasks' streams (its status and its jobs, exactly as the projection showed them).

Which clock: by default each event's own ``timestamp`` (the database time the Gateway decided
with; covered by the hash chain and never decreasing along a stream), so the events "as of T"
are a prefix of the stream. ``clock="recorded"`` uses the ``recorded_at`` column instead (the
inserting transaction's start; not covered by the chain): the prefix ends at the last version
recorded at or before T, in the spirit of eventsourcing's "get the aggregate at version N".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from psycopg import AsyncConnection

from leasehold.domain.task import TaskState, project_task
from leasehold.persistence.event_log import StoredRow, rows_of_streams, stream_rows
from leasehold.projections.memory import MemoryTables
from leasehold.projections.projector import project
from leasehold.projections.rows import Row
from leasehold.replay.log import require_stream, scan_task_ids

Clock = Literal["event", "recorded"]


@dataclass(frozen=True, slots=True)
class TaskAsOf:
    task_id: UUID
    at: datetime
    version: int  # events folded (0: the task did not exist yet)
    total_versions: int
    task: TaskState | None


@dataclass(slots=True)
class ScanAsOf:
    scan_id: UUID
    at: datetime
    version: int
    scan: Row | None
    jobs: list[Row] = field(default_factory=list)
    tasks: list[TaskAsOf] = field(default_factory=list)


def prefix_until(rows: list[StoredRow], at: datetime, clock: Clock) -> list[StoredRow]:
    """The stream's rows (version order) that make its state as of ``at``."""
    if clock == "recorded":
        last = max((r.originator_version for r in rows if r.recorded_at <= at), default=0)
        return [r for r in rows if r.originator_version <= last]
    out = []
    for row in rows:
        if row.decode().timestamp > at:
            break
        out.append(row)
    return out


async def task_as_of(conn: AsyncConnection[Any], task_id: UUID, at: datetime, *,
                     clock: Clock = "event") -> TaskAsOf:
    await require_stream(conn, task_id, "TaskCreated")
    return _task_as_of(task_id, await stream_rows(conn, task_id), at, clock)


def _task_as_of(task_id: UUID, rows: list[StoredRow], at: datetime, clock: Clock) -> TaskAsOf:
    kept = prefix_until(rows, at, clock)
    task = project_task(r.decode() for r in kept) if kept else None
    return TaskAsOf(task_id, at, len(kept), len(rows), task)


async def scan_as_of(conn: AsyncConnection[Any], scan_id: UUID, at: datetime, *,
                     clock: Clock = "event") -> ScanAsOf:
    await require_stream(conn, scan_id, "ScanCreated")
    scan_rows = await stream_rows(conn, scan_id)
    task_ids = await scan_task_ids(conn, scan_id, scan_rows)
    streams: dict[UUID, list[StoredRow]] = {scan_id: scan_rows, **{t: [] for t in task_ids}}
    for row in await rows_of_streams(conn, task_ids):
        streams[row.originator_id].append(row)
    kept = {oid: prefix_until(sorted(rows, key=lambda r: r.originator_version), at, clock)
            for oid, rows in streams.items()}
    tables = MemoryTables()
    for row in sorted((r for rows in kept.values() for r in rows), key=lambda r: r.notification_id):
        tables.apply(project(row.decode(), row.hash))
    result = ScanAsOf(scan_id, at, len(kept[scan_id]), tables.tables["scans"].get((scan_id,)))
    result.jobs = sorted((j for j in tables.tables["scan_jobs"].values() if j["scan_id"] == scan_id),
                         key=lambda j: j["position"])
    result.tasks = [_task_as_of(t, sorted(streams[t], key=lambda r: r.originator_version), at, clock)
                    for t in task_ids]
    result.tasks = [t for t in result.tasks if t.version > 0]
    return result
