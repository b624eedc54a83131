"""What the worker is doing, for people and machines.

:class:`Status` counts tasks (running, completed, failed, timeout, cancelled, lost) and knows the running
ones. Two views show it on stderr: :class:`RichStatusView`, a live table when stderr is a
terminal, and :class:`LogStatusView`, one ``status`` log line per change (plain text, or JSON
with ``--log-format json``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

__all__ = ["LogStatusView", "RichStatusView", "RunningTask", "Status"]

log = logging.getLogger("leasehold.worker.status")

OUTCOMES = ("completed", "failed", "timeout", "cancelled", "lost")


@dataclass
class RunningTask:
    task_id: UUID
    attempt_id: UUID
    task_type: str
    attempt_number: int
    started: float = field(default_factory=time.monotonic)
    phase: str = "starting"
    records: int = 0
    pid: int | None = None


class Status:
    """Counters and running tasks; listeners are called after every change."""

    def __init__(self, max_concurrency: int) -> None:
        self.max_concurrency = max_concurrency
        self.running: dict[UUID, RunningTask] = {}
        self.counts: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.gateway_problem: str | None = None
        self.stopping = False
        self._listeners: list[Callable[[str], None]] = []

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """``listener(change)`` after each change (``change``: a short word)."""
        self._listeners.append(listener)

    def _changed(self, change: str) -> None:
        for listener in self._listeners:
            listener(change)

    def task_started(self, task: RunningTask) -> None:
        self.running[task.attempt_id] = task
        self._changed("started")

    def task_phase(self, attempt_id: UUID, phase: str, *, pid: int | None = None) -> None:
        task = self.running.get(attempt_id)
        if task is not None and (task.phase != phase or pid is not None):
            task.phase = phase
            task.pid = pid if pid is not None else task.pid
            self._changed("phase")

    def task_records(self, attempt_id: UUID, records: int) -> None:
        task = self.running.get(attempt_id)
        if task is not None:
            task.records = records  # shown by the live view; no log line per record

    def task_finished(self, attempt_id: UUID, outcome: str) -> None:
        self.running.pop(attempt_id, None)
        self.counts[outcome] += 1
        self._changed(outcome)

    def gateway_unreachable(self, reason: str) -> None:
        if self.gateway_problem is None:
            self.gateway_problem = reason
            self._changed("gateway-unreachable")
        self.gateway_problem = reason

    def gateway_reachable(self) -> None:
        if self.gateway_problem is not None:
            self.gateway_problem = None
            self._changed("gateway-reachable")

    def shutting_down(self) -> None:
        self.stopping = True
        self._changed("stopping")

    def summary(self) -> dict[str, Any]:
        return {"running": len(self.running), "capacity": self.max_concurrency, **self.counts}

    def line(self) -> str:
        s = self.summary()
        text = (f"running {s['running']}/{s['capacity']} · completed {s['completed']} · failed {s['failed']}"
                f" · timeout {s['timeout']} · cancelled {s['cancelled']} · lost {s['lost']}")
        if self.gateway_problem:
            text += f" · gateway unavailable ({self.gateway_problem})"
        if self.stopping:
            text += " · shutting down"
        return text


class LogStatusView:
    """One ``status`` log line (INFO) per change, with the counters as fields."""

    def __init__(self, status: Status) -> None:
        self.status = status
        status.subscribe(self._on_change)

    def _on_change(self, change: str) -> None:
        if change == "phase":
            return  # phases are in the task's own log lines
        log.info("status", extra={"change": change, **self.status.summary(),
                                  **({"gateway_problem": self.status.gateway_problem}
                                     if self.status.gateway_problem else {})})


class RichStatusView:
    """A live table of running tasks and the counters, redrawn a few times a second."""

    def __init__(self, status: Status, console: Any) -> None:
        from rich.live import Live  # deferred: rich only for the live view on a terminal

        self.status = status
        self.live = Live(get_renderable=self._render, console=console, refresh_per_second=4, transient=True)

    def __enter__(self) -> RichStatusView:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()
        self.live.console.print(self.status.line())

    def _render(self) -> Any:
        from rich.table import Table  # deferred: rich only for the live view on a terminal

        table = Table(title=self.status.line(), title_justify="left", expand=False)
        for column in ("task", "type", "attempt", "phase", "records", "pid", "elapsed"):
            table.add_column(column)
        now = time.monotonic()
        for task in list(self.status.running.values()):
            table.add_row(str(task.task_id)[:8], task.task_type, str(task.attempt_number), task.phase,
                          str(task.records), str(task.pid or ""), f"{now - task.started:.0f}s")
        return table
