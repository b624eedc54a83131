"""``replay timeline``: every event of a task (or of a scan and all its tasks), in order.

Each entry says when (the event's own time, which the Gateway took from the database clock and
which the hash chain covers), who (``actor``), what (event type), the task's state before and
after (folded with :func:`domain.task.evolve`), which attempt it concerns, and a one-line
summary. Rejected worker writes (``WriteRejected``) are included: they change no state, so
their "transition" stays put and they are flagged ``rejected``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from leasehold.domain import events as ev
from leasehold.domain.task import TaskState, evolve
from leasehold.persistence.event_log import StoredRow, rows_of_streams, stream_rows
from leasehold.projections.memory import MemoryTables
from leasehold.projections.projector import project
from leasehold.protocol.clipping import clip
from leasehold.protocol.tracing import trace_id_of
from leasehold.replay.archive import archived_rows
from leasehold.replay.log import NotFound, require_stream, scan_task_ids

_BASE_FIELDS = frozenset({"originator_id", "originator_version", "timestamp", "actor"})


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of a timeline."""

    notification_id: int
    stream_id: UUID
    stream: str  # "task" or "scan"
    version: int
    time: datetime
    recorded_at: datetime
    actor: str
    event_type: str
    state_before: str | None
    state_after: str | None
    attempt: int | None
    attempt_id: UUID | None
    rejected: bool
    summary: str
    event: ev.DomainEvent
    hash: bytes  # the event's chain hash

    @property
    def transition(self) -> str:
        if self.state_before == self.state_after:
            return self.state_after or ""
        return f"{self.state_before or '∅'} → {self.state_after or '∅'}"

    def as_json(self) -> dict[str, Any]:
        # Clipped: an event stored before the input limits may nest deeper than JSON output can.
        data, clipped = clip(self.event.model_dump(mode="json", exclude=set(_BASE_FIELDS)))
        return {
            "notification_id": self.notification_id, "stream": self.stream, "stream_id": str(self.stream_id),
            "version": self.version, "time": self.time.isoformat(), "recorded_at": self.recorded_at.isoformat(),
            "actor": self.actor, "event": self.event_type, "state_before": self.state_before,
            "state_after": self.state_after, "attempt": self.attempt,
            "attempt_id": str(self.attempt_id) if self.attempt_id else None, "rejected": self.rejected,
            "summary": self.summary,
            "data": data, "data_clipped": clipped,
        }


async def task_timeline(conn: AsyncConnection[Any], task_id: UUID, *,
                        archives: Sequence[Path] = ()) -> list[Entry]:
    """The task's events in version order; with ``archives`` (archived partitions), its
    archived events first."""
    rows = _joined(archived_rows(list(archives), {task_id}) if archives else [], await stream_rows(conn, task_id))
    await _require_first(conn, task_id, rows, "TaskCreated", archived=bool(archives))
    return _task_entries(rows)


async def scan_timeline(conn: AsyncConnection[Any], scan_id: UUID, *,
                        archives: Sequence[Path] = ()) -> list[Entry]:
    """The scan's events and all its tasks' events, merged by time (then log order); with
    ``archives``, their archived events too."""
    scan_rows = _joined(archived_rows(list(archives), {scan_id}) if archives else [], await stream_rows(conn, scan_id))
    await _require_first(conn, scan_id, scan_rows, "ScanCreated", archived=bool(archives))
    task_ids = await scan_task_ids(conn, scan_id, scan_rows)
    by_stream: dict[UUID, list[StoredRow]] = {t: [] for t in task_ids}
    live = await rows_of_streams(conn, task_ids)
    for row in archived_rows(list(archives), set(task_ids)) + live if archives else live:
        by_stream[row.originator_id].append(row)
    entries = _scan_entries(scan_rows)
    for rows in by_stream.values():
        entries += _task_entries(sorted(rows, key=lambda r: r.originator_version))
    entries.sort(key=lambda e: (e.time, e.notification_id))
    return _with_scan_status(scan_id, entries)


def _joined(archived: list[StoredRow], live: list[StoredRow]) -> list[StoredRow]:
    """One stream's archived and live events, in version order (a version in both: the live one)."""
    by_version = {r.originator_version: r for r in archived}
    by_version.update((r.originator_version, r) for r in live)
    return [by_version[v] for v in sorted(by_version)]


async def _require_first(conn: AsyncConnection[Any], stream_id: UUID, rows: list[StoredRow], expected: str, *,
                         archived: bool) -> None:
    """Raise :class:`NotFound` unless ``rows`` are a whole stream of the ``expected`` kind."""
    if not archived and (not rows or rows[0].originator_version == 1):
        await require_stream(conn, stream_id, expected)
        return
    if not rows:
        raise NotFound(f"no events for {stream_id} in the log or the archives given")
    if rows[0].originator_version != 1:
        raise NotFound(f"{stream_id}: its events before v{rows[0].originator_version} were archived and are in"
                       " no archive given (--archive)")
    if rows[0].event_type != expected:
        raise NotFound(f"{stream_id} is a {rows[0].event_type} stream, not a {expected.removesuffix('Created')}"
                       " stream")


def _with_scan_status(scan_id: UUID, entries: list[Entry]) -> list[Entry]:
    """Give the scan's own entries its status before and after, as the projection shows it: the
    entries go through the Gateway's projector, which also counts the first lease of any of its
    tasks as the moment the scan started running. That one cross-stream change commutes with the
    scan's own events, so the timeline's order (by time) gives the projection's statuses."""
    tables = MemoryTables()
    scans = tables.tables["scans"]

    def status() -> str | None:
        row = scans.get((scan_id,))
        return None if row is None else row["status"]

    out: list[Entry] = []
    for entry in entries:
        before = status()
        tables.apply(project(entry.event, entry.hash))
        if entry.stream == "scan":
            entry = replace(entry, state_before=before, state_after=status())
        out.append(entry)
    return out


def _task_entries(rows: list[StoredRow]) -> list[Entry]:
    out: list[Entry] = []
    task: TaskState | None = None
    attempt_numbers: dict[UUID, int] = {}
    for row in rows:
        event = row.decode()
        previous = task
        before = task.state if task is not None else None
        task = evolve(event, task)
        if isinstance(event, ev.TaskLeased):
            attempt_numbers[event.attempt_id] = event.attempt_number
        attempt_id: UUID | None = getattr(event, "attempt_id", None)
        out.append(Entry(
            row.notification_id, row.originator_id, "task", row.originator_version, event.timestamp,
            row.recorded_at, event.actor, row.event_type, before, task.state,
            attempt_numbers.get(attempt_id) if attempt_id is not None else None, attempt_id,
            isinstance(event, ev.WriteRejected),
            summarize(event, attempt_numbers) + _cancel_leg(event, previous), event, row.hash))
    return out


def _cancel_leg(event: ev.DomainEvent, task: TaskState | None) -> str:
    """How long the cancellation's previous step was ago: the request, for its delivery; the
    delivery (or the request, when it was never delivered), for the end of a cancellation."""
    if task is None or task.cancel_requested_at is None or task.state != "cancelling":
        return ""
    if isinstance(event, ev.CancelDelivered):
        return f" ({_seconds(event.timestamp - task.cancel_requested_at)} after the request)"
    if isinstance(event, ev.TaskCancelled):
        if task.cancel_delivered_at is not None:
            return f" ({_seconds(event.timestamp - task.cancel_delivered_at)} after the delivery)"
        return f" (never delivered; {_seconds(event.timestamp - task.cancel_requested_at)} after the request)"
    return ""


def _seconds(delta: timedelta) -> str:
    return f"{delta.total_seconds():.3f}s"


def _scan_entries(rows: list[StoredRow]) -> list[Entry]:
    """The scan's own events (statuses are filled in by :func:`_with_scan_status`)."""
    out: list[Entry] = []
    for row in rows:
        event = row.decode()
        out.append(Entry(
            row.notification_id, row.originator_id, "scan", row.originator_version, event.timestamp,
            row.recorded_at, event.actor, row.event_type, None, None, None, None, False,
            summarize(event, {}), event, row.hash))
    return out


def _short(value: object) -> str:
    return str(value)[:8]


def _at(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


def _fair_share(share: ev.FairShareGrant | None) -> str:
    """Why the worker's organisations chose this task (domain.fairness), when the lease says."""
    if share is None:
        return ""
    cap = f"/{share.max_live_attempts}" if share.max_live_attempts is not None else ""
    others = ", ".join(f"{_short(e.organization_id)} p={e.priority} vt={e.virtual_time:g}"
                       for e in share.eligible if e.organization_id != share.organization_id)
    return (f"; fair share: tag {share.tag:g} (floor {share.floor:g}, weight {share.weight}) among"
            f" {len(share.eligible)} eligible organisation(s){' [' + others + ']' if others else ''},"
            f" virtual time now {share.virtual_time:g}, live {share.live}{cap}, waited {share.waited_seconds:.3f}s")


def summarize(event: ev.DomainEvent, attempts: dict[UUID, int]) -> str:
    """One human line about the event's own facts; ``trace=<id>`` ends it when the event was
    recorded by a traced request (the trace to open in the tracing backend)."""
    line = _summary(event, attempts)
    if event.traced is None:
        return line
    trace = getattr(event, "trace_id", None) or trace_id_of(getattr(event, "traceparent", None))
    return f"{line} trace={trace}" if trace else line


def _summary(event: ev.DomainEvent, attempts: dict[UUID, int]) -> str:
    def attempt(aid: UUID) -> str:
        number = attempts.get(aid)
        return f"attempt #{number}" if number is not None else f"unknown attempt {_short(aid)}"

    match event:
        case ev.TaskCreated():
            return (f"{event.task_type} priority={event.priority} max_attempts={event.max_attempts}"
                    f" lease={event.lease_seconds}s timeout={event.execution_timeout_seconds}s")
        case ev.TaskLeased():
            request = f" request={event.request_id}" if event.request_id else ""
            return (f"to worker {_short(event.worker_id)} lease until {_at(event.lease_expires_at)}"
                    f" deadline {_at(event.deadline_at)}{request}{_fair_share(event.fair_share)}")
        case ev.LeaseReissued():
            return f"{attempt(event.attempt_id)}: repeated acquire, fresh token issued"
        case ev.TaskStarted():
            return f"{attempt(event.attempt_id)} started"
        case ev.LeaseRenewed():
            return f"lease until {_at(event.lease_expires_at)}"
        case ev.ResultBatchAccepted():
            final = " final" if event.final else ""
            return (f"batch #{event.sequence_number}{final}: {event.record_count} records"
                    f" sha256 {event.payload_sha256[:12]}… key {event.idempotency_key}")
        case ev.TaskCompleted():
            return f"{attempt(event.attempt_id)} succeeded"
        case ev.AttemptFailed():
            retry = f", retry after {_at(event.available_at)}" if event.available_at else ""
            return (f"{attempt(event.attempt_id)} failed ({event.reason}): {event.error[:80]}"
                    f"{'' if event.retryable else ' [not retryable]'} -> {event.outcome}{retry}")
        case ev.LeaseExpired():
            retry = f", retry after {_at(event.available_at)}" if event.available_at else ""
            return f"{attempt(event.attempt_id)} lease expired -> {event.outcome}{retry}"
        case ev.AttemptTimedOut():
            return (f"{attempt(event.attempt_id)} timed out: execution deadline {_at(event.deadline_at)} reached"
                    " -> failed_terminal")
        case ev.CancelRequested():
            return f"cancel requested: {event.reason}"
        case ev.CancelDelivered():
            return f"cancel delivered to {attempt(event.attempt_id)} on {event.channel}"
        case ev.TaskCancelled():
            which = f"{attempt(event.attempt_id)} " if event.attempt_id else ""
            return f"{which}cancelled: {event.reason}"
        case ev.AttemptRevoked():
            retry = f", available again {_at(event.available_at)}" if event.available_at else ""
            return f"{attempt(event.attempt_id)} ended by the gateway ({event.reason}) -> {event.outcome}{retry}"
        case ev.TaskRetried():
            return f"retried by an operator: {event.reason} (max_attempts now {event.max_attempts}) -> pending"
        case ev.WriteRejected():
            return f"REJECTED {event.command} by {attempt(event.attempt_id)}: {event.reason}"
        case ev.ScanCreated():
            return f"{event.execution_mode} scan, targets {str(event.targets)[:80]}"
        case ev.ScanJobQueued():
            return f"job {event.position} ({_short(event.job_id)}) queued: {event.plugin}"
        case ev.ScanFinished():
            return f"finished: {event.status}"
        case ev.ScanOriginRecorded():
            origin = []
            if event.stored_profile_id:
                origin.append(f"steps copied from stored profile {_short(event.stored_profile_id)}")
            if event.legacy_scan_id:
                origin.append(f"drained from legacy scan {event.legacy_scan_id}")
            return ", ".join(origin) or "no recorded origin"
        case ev.LegacyScanStatusRecorded():
            return f"legacy side reports: {event.status}"
        case ev.ScanHandedOver():
            return (f"handed over to Gateway scan {_short(event.gateway_scan_id)};"
                    f" {len(event.job_ids)} legacy jobs cancelled")
        case ev.ScanCancelRequested():
            return f"cancel requested: {event.reason}"
        case ev.ScanReopened():
            return f"reopened: task {_short(event.task_id)} retried ({event.reason})"
    fields = {k: v for k, v in event.__dict__.items() if k not in _BASE_FIELDS}
    return " ".join(f"{k}={v}" for k, v in fields.items())[:160]
