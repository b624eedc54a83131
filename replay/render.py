"""Human output (rich tables) and machine output (JSON) of the replay commands.

Tables go to stdout; progress bars go to stderr and only when it is a terminal, so
``--json`` output and redirected tables stay clean.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from leasehold.domain.task import TaskState
from leasehold.replay.asof import ScanAsOf, TaskAsOf
from leasehold.replay.timeline import Entry


def console() -> Console:
    """stdout; wide when not a terminal, so redirected tables are not wrapped to 80 columns."""
    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "200"))
    return Console(width=width, highlight=False)


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, default=_default, option=orjson.OPT_INDENT_2).decode() + "\n")


def _default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(type(value).__name__)


#: Without a terminal, a progress line goes to stderr every this many seconds, the first one after
#: as long: short runs (and the tests) print none.
PROGRESS_LINE_SECONDS = 10.0


@contextmanager
def progress_bar(description: str, total: int | None, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A callback ``update(done)`` that shows events done, the rate and an ETA on stderr: a
    transient bar on a terminal; otherwise, once a run has lasted ``PROGRESS_LINE_SECONDS``,
    a plain line every as many seconds. A no-op when disabled."""
    if not enabled:
        yield lambda done: None
        return
    if not sys.stderr.isatty():
        yield _progress_lines(description, total)
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                   console=Console(stderr=True), transient=True)
    with bar:
        task = bar.add_task(description, total=total, rate="")
        started = time.monotonic()

        def update(done: int) -> None:
            elapsed = time.monotonic() - started
            rate = f"{done / elapsed:,.0f} events/s" if elapsed > 0.5 else ""
            # The total is the planner's estimate: never let the count run past it.
            bar.update(task, completed=done, total=max(total or 0, done), rate=rate)

        yield update


def _progress_lines(description: str, total: int | None) -> Callable[[int], None]:
    started = time.monotonic()
    next_line = started + PROGRESS_LINE_SECONDS

    def update(done: int) -> None:
        nonlocal next_line
        now = time.monotonic()
        if now < next_line:
            return
        next_line = now + PROGRESS_LINE_SECONDS
        rate = done / (now - started)
        line = f"{description}: {done:,} events, {rate:,.0f} events/s"
        if total and rate > 0 and done < total:
            line += f", about {(total - done) / rate:,.0f}s left (of ~{total:,})"
        print(line, file=sys.stderr, flush=True)

    return update


def _time(value: datetime | None) -> str:
    return value.isoformat(sep=" ", timespec="milliseconds") if value is not None else ""


def timeline_table(entries: list[Entry], *, merged: bool) -> Table:
    table = Table(show_lines=False, header_style="bold")
    for name in ("#", "time", *(["stream"] if merged else []), "v", "actor", "event", "transition", "att",
                 "details"):
        table.add_column(name, overflow="fold")
    for e in entries:
        style = "red" if e.rejected else None
        table.add_row(
            str(e.notification_id), _time(e.time), *([f"{e.stream} {str(e.stream_id)[:8]}"] if merged else []),
            str(e.version), e.actor, e.event_type, e.transition, "" if e.attempt is None else str(e.attempt),
            e.summary, style=style)
    return table


def task_state_json(task: TaskState | None) -> dict[str, Any] | None:
    if task is None:
        return None
    attempt = task.current_attempt
    return {
        "id": str(task.id), "version": task.version, "state": task.state, "task_type": task.task_type,
        "attempt_count": task.attempt_count, "max_attempts": task.max_attempts,
        "available_at": task.available_at.isoformat(), "updated_at": task.updated_at.isoformat(),
        "cancel_requested_at": task.cancel_requested_at.isoformat() if task.cancel_requested_at else None,
        "cancel_delivered_at": task.cancel_delivered_at.isoformat() if task.cancel_delivered_at else None,
        "cancel_delivery_channel": task.cancel_delivery_channel,
        "finished_at": task.finished_at.isoformat() if task.finished_at else None, "last_error": task.last_error,
        "attempt": None if attempt is None else {
            "id": str(attempt.id), "number": attempt.attempt_number, "worker_id": str(attempt.worker_id),
            "status": attempt.status, "leased_at": attempt.leased_at.isoformat(),
            "lease_expires_at": attempt.lease_expires_at.isoformat(),
            "deadline_at": attempt.deadline_at.isoformat(),
            "started_at": attempt.started_at.isoformat() if attempt.started_at else None,
            "finished_at": attempt.finished_at.isoformat() if attempt.finished_at else None,
        },
    }


def task_as_of_json(result: TaskAsOf) -> dict[str, Any]:
    return {"task_id": str(result.task_id), "at": result.at.isoformat(), "events_folded": result.version,
            "events_total": result.total_versions, "task": task_state_json(result.task)}


def scan_as_of_json(result: ScanAsOf) -> dict[str, Any]:
    scan = result.scan
    return {
        "scan_id": str(result.scan_id), "at": result.at.isoformat(), "events_folded": result.version,
        "scan": None if scan is None else {k: _jsonable(v) for k, v in scan.items()},
        "jobs": [{k: _jsonable(v) for k, v in job.items()} for job in result.jobs],
        "tasks": [task_as_of_json(t) for t in result.tasks],
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


def task_as_of_table(result: TaskAsOf) -> Table:
    table = Table(title=f"task {result.task_id} as of {_time(result.at)}"
                        f" ({result.version} of {result.total_versions} events)", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    task = result.task
    if task is None:
        table.add_row("state", "did not exist yet")
        return table
    attempt = task.current_attempt
    rows: list[tuple[str, str]] = [
        ("state", task.state), ("attempts", f"{task.attempt_count} of {task.max_attempts}"),
        ("available at", _time(task.available_at)), ("last change", _time(task.updated_at)),
    ]
    if task.cancel_requested_at:
        rows.append(("cancel requested", _time(task.cancel_requested_at)))
    if task.cancel_delivered_at:
        rows.append(("cancel delivered", f"{_time(task.cancel_delivered_at)} on {task.cancel_delivery_channel}"))
    if task.last_error:
        rows.append(("last error", task.last_error))
    if attempt is not None:
        rows += [
            ("attempt", f"#{attempt.attempt_number} {attempt.id} ({attempt.status})"),
            ("worker", str(attempt.worker_id)), ("leased at", _time(attempt.leased_at)),
            ("lease expires", _time(attempt.lease_expires_at)), ("deadline", _time(attempt.deadline_at)),
            ("started at", _time(attempt.started_at)), ("finished at", _time(attempt.finished_at)),
        ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def scan_as_of_tables(result: ScanAsOf) -> list[Table]:
    head = Table(title=f"scan {result.scan_id} as of {_time(result.at)}", show_header=False)
    head.add_column("field", style="bold")
    head.add_column("value")
    if result.scan is None:
        head.add_row("status", "did not exist yet")
        return [head]
    head.add_row("status", str(result.scan["status"]))
    head.add_row("created", _time(result.scan["created_at"]))
    head.add_row("finished", _time(result.scan["finished_at"]))
    tasks = Table(title="tasks", header_style="bold")
    for name in ("job", "plugin", "job status", "task", "state", "attempt", "worker", "leased at",
                 "lease expires"):
        tasks.add_column(name, overflow="fold")
    by_job = {t.task.scan_job_id: t for t in result.tasks if t.task is not None}
    for job in result.jobs:
        t = by_job.get(job["id"])
        task = t.task if t is not None else None
        attempt = task.current_attempt if task is not None else None
        tasks.add_row(
            str(job["position"]), str(job["plugin"]), str(job["status"]), str(task.id)[:8] if task else "",
            task.state if task else "",
            f"#{attempt.attempt_number} {attempt.status}" if attempt else "",
            str(attempt.worker_id)[:8] if attempt else "", _time(attempt.leased_at) if attempt else "",
            _time(attempt.lease_expires_at) if attempt else "")
    return [head, tasks]
