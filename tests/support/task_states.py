"""Tasks in any lifecycle state, built by the domain's own ``decide``/``evolve`` (no database).

``Story`` keeps one task and a moving clock; each step decides a command at the current time and
folds the events, so every state a test starts from is one the real state machine can reach.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from leasehold.domain.events import DomainEvent
from leasehold.domain.task import (
    AttemptState,
    Command,
    CreateTask,
    GrantLease,
    MarkRunning,
    SubmitBatch,
    TaskState,
    WorkerView,
    decide,
    project_task,
)

START = datetime(2030, 1, 1, tzinfo=UTC)
TASK_ID, SCAN_ID, JOB_ID, ORG_ID = UUID(int=1), UUID(int=2), UUID(int=3), UUID(int=4)


def token_hash(n: int) -> str:
    """A lease token hash (hex sha256 shaped); the domain only compares them."""
    return f"{n:064x}"


def worker(**changes: Any) -> WorkerView:
    """An enabled worker with room for more, able to run ``probe`` tasks needing ``tcp``."""
    base = WorkerView(id=UUID(int=99), enabled=True, revoked=False, max_concurrent_tasks=2, live_attempts=0,
                      capabilities=frozenset({"tcp", "udp"}), task_types=frozenset({"probe", "dns"}))
    return replace(base, **changes)


@dataclass
class Story:
    """One task's life so far, and the time now."""

    task: TaskState
    now: datetime = START
    events: list[DomainEvent] = field(default_factory=list)
    attempts: int = 0

    @classmethod
    def create(cls, **options: Any) -> Story:
        """A pending task of type ``probe`` needing ``tcp`` (``options`` override ``CreateTask``)."""
        command = CreateTask(**{"task_id": TASK_ID, "scan_id": SCAN_ID, "scan_job_id": JOB_ID,
                                "organization_id": ORG_ID, "task_type": "probe",
                                "required_capabilities": ("tcp",), "max_attempts": 3, "lease_seconds": 60,
                                "execution_timeout_seconds": 600, **options})
        events = decide(None, command, now=START, actor="test")
        task = project_task(events)
        assert task is not None
        return cls(task, START, list(events))

    def decide(self, command: Command, *, draw: float = 0.5) -> list[DomainEvent]:
        """The events of ``command`` now, without applying them."""
        return decide(self.task, command, now=self.now, actor="test", draw=draw)

    def apply(self, command: Command, *, draw: float = 0.5) -> list[DomainEvent]:
        """Decide ``command`` now and fold its events into the task."""
        events = self.decide(command, draw=draw)
        task = project_task(events, self.task)
        assert task is not None
        self.task = task
        self.events += events
        return events

    def wait(self, seconds: float) -> Story:
        self.now += timedelta(seconds=seconds)
        return self

    @property
    def attempt(self) -> AttemptState:
        assert self.task.current_attempt is not None
        return self.task.current_attempt

    @property
    def token(self) -> str:
        return self.attempt.lease_token_hash

    def lease(self, **worker_changes: Any) -> Story:
        self.attempts += 1
        self.apply(GrantLease(attempt_id=UUID(int=100 + self.attempts), worker=worker(**worker_changes),
                              lease_token_hash=token_hash(100 + self.attempts)))
        return self

    def run(self) -> Story:
        self.apply(MarkRunning(self.attempt, self.token))
        return self

    def batch(self, sequence_number: int, *, final: bool = False) -> Story:
        self.apply(SubmitBatch(self.attempt, self.token, batch_id=UUID(int=1000 + sequence_number),
                               sequence_number=sequence_number, idempotency_key=f"k{sequence_number}",
                               payload_sha256="ab" * 32, record_count=2, final=final))
        return self


def leased(**options: Any) -> Story:
    return Story.create(**options).lease()


def running(**options: Any) -> Story:
    return leased(**options).run()
