"""A hypothesis state machine drives the pure domain with random commands and checks it
against a simple model of the RFC's transition table (no database, no clock, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from uuid import UUID

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from leasehold.domain.errors import InvalidTransition
from leasehold.domain.events import (
    AttemptRevoked,
    AttemptTimedOut,
    CancelDelivered,
    LeaseExpired,
    TaskCancelled,
    WriteRejected,
)
from leasehold.domain.retry import DEFAULT_RETRY_POLICY
from leasehold.domain.task import (
    AcknowledgeCancel,
    AttemptState,
    Complete,
    CreateTask,
    DeliverCancel,
    ExceedDeadline,
    ExpireLease,
    Fail,
    GrantLease,
    MarkRunning,
    Renew,
    RequestCancel,
    RevokeAttempt,
    SubmitBatch,
    TaskState,
    TerminateCancelling,
    WorkerView,
    decide,
    project_task,
)

# RFC "Task state machine": every arrow of the diagram. Anything else is a bug.
ALLOWED = {
    ("pending", "leased"), ("retry_wait", "leased"), ("leased", "running"), ("running", "running"),
    ("leased", "retry_wait"), ("running", "retry_wait"), ("leased", "failed_terminal"),
    ("running", "failed_terminal"), ("running", "completed"), ("leased", "cancelling"),
    ("running", "cancelling"), ("pending", "cancelled"), ("retry_wait", "cancelled"),
    ("cancelling", "cancelled"),
}
LIVE_STATES = {"leased", "running", "cancelling"}
WORKER = WorkerView(id=UUID(int=99), enabled=True, revoked=False, max_concurrent_tasks=10, live_attempts=0,
                    capabilities=frozenset({"tcp"}), task_types=frozenset({"probe"}))
OTHER_TYPE_WORKER = replace(WORKER, id=UUID(int=98), task_types=frozenset({"dns"}))
MISSING_CAPABILITY_WORKER = replace(WORKER, id=UUID(int=97), capabilities=frozenset({"udp"}))


@dataclass(frozen=True)
class Sweep:
    attempt: AttemptState
    decided_at: datetime
    events: tuple[object, ...]


def token_hash(n: int) -> str:
    return f"{n:064x}"


class TaskMachine(RuleBasedStateMachine):
    """The real ``decide``/``evolve`` under random commands, checked against the RFC table."""

    def __init__(self) -> None:
        super().__init__()
        self.now = datetime(2030, 1, 1, tzinfo=UTC)
        self.ids = 0
        self.task: TaskState
        self.attempts: list[AttemptState] = []  # every attempt ever made, as last seen
        self.batches = 0
        self.final_accepted = False
        self.deliveries = 0  # CancelDelivered events on the task (one cancellation at most)
        self.sweeps: list[Sweep] = []  # every sweep decision: the attempt it named, when, and its events

    def _id(self) -> UUID:
        self.ids += 1
        return UUID(int=self.ids)

    @initialize(max_attempts=st.integers(1, 4), lease=st.integers(5, 60), timeout=st.integers(30, 300))
    def create(self, max_attempts: int, lease: int, timeout: int) -> None:
        events = decide(None, CreateTask(task_id=self._id(), scan_id=self._id(), scan_job_id=self._id(),
                                         organization_id=self._id(), task_type="probe", required_capabilities=("tcp",),
                                         max_attempts=max_attempts, lease_seconds=lease,
                                         execution_timeout_seconds=timeout), now=self.now, actor="test")
        task = project_task(events)
        assert task is not None and task.state == "pending"
        self.task = task

    def _apply(self, command: object, draw: float = 0.5, *, refused: bool = False) -> list[object]:
        """Decide and fold ``command``, which must raise ``InvalidTransition`` exactly when ``refused``."""
        before = self.task
        try:
            events = decide(before, command, now=self.now, actor="test", draw=draw)  # type: ignore[arg-type]
        except InvalidTransition:
            assert refused, (before.state, command)
            return []
        assert not refused, (before.state, command, events)
        after = project_task(events, before)
        assert after is not None
        assert after.version == before.version + len(events)
        if events and isinstance(events[0], WriteRejected):
            assert len(events) == 1
            assert after.state == before.state and after.current_attempt == before.current_attempt
        if after.state != before.state:
            assert (before.state, after.state) in ALLOWED, (before.state, after.state, command)
        if after.current_attempt is not None:
            self.attempts = [a for a in self.attempts if a.id != after.current_attempt.id]
            self.attempts.append(after.current_attempt)
        self.task = after
        self.deliveries += sum(isinstance(e, CancelDelivered) for e in events)
        return list(events)

    def _after_attempt_ended(self, before: TaskState, *, timed_out: bool) -> str:
        """Where a task goes when its attempt ends without success: a deadline reached while the
        lease was held is a terminal timeout, a lapsed lease retries while attempts remain."""
        if before.state == "cancelling":
            return "cancelled"
        if timed_out:
            return "failed_terminal"
        return "retry_wait" if before.attempt_count < before.max_attempts else "failed_terminal"

    # gateway ----------------------------------------------------------------------------

    @rule()
    def acquire(self) -> None:
        before = self.task
        acquirable = (before.state in ("pending", "retry_wait") and before.available_at <= self.now
                      and before.attempt_count < before.max_attempts)
        events = self._apply(GrantLease(attempt_id=self._id(), worker=WORKER,
                                        lease_token_hash=token_hash(self.ids)), refused=not acquirable)
        assert bool(events) == acquirable
        if events:
            assert self.task.attempt_count == before.attempt_count + 1
            self.batches, self.final_accepted = 0, False

    @rule(worker=st.sampled_from([OTHER_TYPE_WORKER, MISSING_CAPABILITY_WORKER]))
    def acquire_by_a_worker_that_cannot_run_it(self, worker: WorkerView) -> None:
        """Whatever the task's state, a worker without its type or a capability never gets it."""
        self._apply(GrantLease(attempt_id=self._id(), worker=worker, lease_token_hash=token_hash(self.ids)),
                    refused=True)

    @rule(seconds=st.sampled_from([1, 5, 20, 61, 400]))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule(limit=st.sampled_from(["lease", "deadline"]), offset=st.sampled_from([-0.001, 0.0, 1.0]))
    def time_reaches(self, limit: str, offset: float) -> None:
        """Time moves to just before, exactly to, or past the current attempt's lease end or deadline."""
        current = self.task.current_attempt
        if current is not None and current.live:
            at = (current.lease_expires_at if limit == "lease" else current.deadline_at) + timedelta(seconds=offset)
            self.now = max(self.now, at)

    @rule()
    def renew_on_time_until_the_deadline(self) -> None:
        """The worker renews every half lease, so its lease ends up capped at the deadline."""
        current = self.task.current_attempt
        while (current is not None and self._valid(current, current.lease_token_hash)
               and current.lease_expires_at < current.deadline_at):
            self._apply(Renew(current, current.lease_token_hash))
            current = self.task.current_attempt
            assert current is not None
            self.now = min(self.now + timedelta(seconds=self.task.lease_seconds / 2), current.deadline_at)

    @rule(end=st.sampled_from(["lease", "deadline"]), when=st.sampled_from(["now", "lease", "deadline"]))
    def sweep(self, end: str, when: str) -> None:
        """The sweeper names the current attempt, whether or not its lease or deadline has passed:
        a sweeper's listing can be stale (the attempt renewed since), and the decision on the
        state as it is now must leave such an attempt alone. ``when``: the sweep runs now, or
        once the clock has reached the attempt's lease end or deadline."""
        if when != "now":
            self.time_reaches(when, 0.0)
        before, current = self.task, self.task.current_attempt
        if current is None:
            return
        ends_at = current.lease_expires_at if end == "lease" else current.deadline_at
        due = current.live and ends_at <= self.now
        timed_out = current.deadline_at <= self.now and current.deadline_at <= current.lease_expires_at
        events = self._apply(ExpireLease(current.id) if end == "lease" else ExceedDeadline(current.id))
        self.sweeps.append(Sweep(current, self.now, tuple(events)))
        assert self.task.state == (self._after_attempt_ended(before, timed_out=timed_out) if due else before.state)

    @rule()
    def cancel(self) -> None:
        before = self.task.state
        self._apply(RequestCancel())
        expected = {"pending": "cancelled", "retry_wait": "cancelled", "leased": "cancelling",
                    "running": "cancelling"}.get(before, before)
        assert self.task.state == expected

    @rule()
    def terminate_cancelling(self) -> None:
        before, grace = self.task, timedelta(seconds=30)
        due = (before.state == "cancelling" and before.cancel_requested_at is not None
               and before.cancel_requested_at + grace <= self.now)
        self._apply(TerminateCancelling(grace))
        assert self.task.state == ("cancelled" if due else before.state)

    @rule(data=st.data(), channel=st.sampled_from(["renew", "long-poll"]))
    def deliver_cancel(self, data: st.DataObject, channel: str) -> None:
        """An acquire answer hands the cancel of some attempt over: recorded once, for the live
        attempt of a cancelling task only, and it changes nothing else."""
        if not self.attempts:
            return
        attempt = data.draw(st.sampled_from(self.attempts))
        before = self.task
        current = before.current_attempt
        expected = (before.state == "cancelling" and before.cancel_delivered_at is None and current is not None
                    and current.id == attempt.id and current.live)
        events = self._apply(DeliverCancel(attempt.id, channel))  # type: ignore[arg-type]
        assert [type(e) for e in events] == ([CancelDelivered] if expected else [])
        assert self.task.state == before.state and self.task.current_attempt == before.current_attempt

    @rule(data=st.data())
    def revoke_attempt(self, data: st.DataObject) -> None:
        """The worker was disabled: its live attempt ends now; the task is free at once."""
        if not self.attempts:
            return
        attempt = data.draw(st.sampled_from(self.attempts))
        before, current = self.task, self.task.current_attempt
        live = current is not None and current.id == attempt.id and current.live
        events = self._apply(RevokeAttempt(attempt.id, "worker disabled"))
        if not live:
            assert events == [] and self.task == before
            return
        assert self.task.current_attempt is not None and self.task.current_attempt.status == "cancelled"
        if before.state == "cancelling":
            assert self.task.state == "cancelled"
        else:
            assert [type(e) for e in events] == [AttemptRevoked]
            remaining = before.attempt_count < before.max_attempts
            assert self.task.state == ("retry_wait" if remaining else "failed_terminal")
            if remaining:
                assert self.task.available_at == self.now  # no backoff: the attempt did not fail

    # worker writes (by the current attempt, or a stale one, with a right or wrong token) ------

    def _pick(self, data: st.DataObject) -> tuple[AttemptState, str] | None:
        if not self.attempts:
            return None
        attempt = data.draw(st.sampled_from(self.attempts))
        good = data.draw(st.booleans())
        return attempt, attempt.lease_token_hash if good else token_hash(0)

    def _valid(self, attempt: AttemptState, token: str, *, cancelling_ok: bool = False) -> bool:
        t, cur = self.task, self.task.current_attempt
        states = ("leased", "running", "cancelling") if cancelling_ok else ("leased", "running")
        return (cur is not None and cur.id == attempt.id and token == cur.lease_token_hash
                and t.state in states and cur.live and cur.lease_expires_at > self.now
                and cur.deadline_at > self.now)

    @rule(data=st.data())
    def progress(self, data: st.DataObject) -> None:
        if (picked := self._pick(data)) is None:
            return
        valid, before = self._valid(*picked), self.task.state
        self._apply(MarkRunning(*picked))
        if valid:
            assert self.task.state == "running"
        else:
            assert self.task.state == before

    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        if (picked := self._pick(data)) is None:
            return
        valid, before = self._valid(*picked), self.task
        events = self._apply(Renew(*picked))
        if valid:
            assert before.current_attempt is not None and self.task.current_attempt is not None
            extended = min(self.now + timedelta(seconds=before.lease_seconds), before.current_attempt.deadline_at)
            assert self.task.current_attempt.lease_expires_at == extended > self.now
        elif not self._valid(*picked, cancelling_ok=True):
            assert [type(e) for e in events] == [WriteRejected]

    @rule(data=st.data(), final=st.booleans())
    def submit(self, data: st.DataObject, final: bool) -> None:
        if (picked := self._pick(data)) is None:
            return
        valid = self._valid(*picked) and not self.final_accepted
        events = self._apply(SubmitBatch(*picked, batch_id=self._id(), sequence_number=self.batches + 1,
                                         idempotency_key=f"k{self.ids}", payload_sha256="0" * 64,
                                         record_count=1, final=final))
        accepted = any(type(e).__name__ == "ResultBatchAccepted" for e in events)
        assert accepted == valid
        if accepted:
            self.batches += 1
            self.final_accepted = final

    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        if (picked := self._pick(data)) is None:
            return
        expected = self._valid(*picked) and self.final_accepted
        before = self.task.state
        self._apply(Complete(*picked))
        assert self.task.state == ("completed" if expected else before)

    @rule(data=st.data(), retryable=st.booleans(), draw=st.floats(0, 0.999))
    def fail(self, data: st.DataObject, retryable: bool, draw: float) -> None:
        if (picked := self._pick(data)) is None:
            return
        valid, before = self._valid(*picked), self.task
        attempts_left = before.attempt_count < before.max_attempts
        self._apply(Fail(*picked, error="boom", retryable=retryable), draw)
        if valid:
            retries = retryable and attempts_left
            assert self.task.state == ("retry_wait" if retries else "failed_terminal")
            if retries:
                delay = DEFAULT_RETRY_POLICY.delay(before.attempt_count, draw)
                assert self.task.available_at == self.now + delay
        else:
            assert self.task.state == before.state

    @rule(data=st.data())
    def acknowledge_cancel(self, data: st.DataObject) -> None:
        if (picked := self._pick(data)) is None:
            return
        attempt, token = picked
        before, current = self.task.state, self.task.current_attempt
        expected = (before == "cancelling" and current is not None and current.id == attempt.id
                    and token == current.lease_token_hash)
        # Acknowledging a cancel nobody requested, with a lease that is still good, is refused.
        unrequested = before != "cancelling" and self._valid(*picked)
        self._apply(AcknowledgeCancel(*picked), refused=unrequested)
        assert self.task.state == ("cancelled" if expected else before)

    # invariants -------------------------------------------------------------------------

    @invariant()
    def at_most_one_live_attempt(self) -> None:
        live = [a for a in self.attempts if a.live]
        assert len(live) <= 1
        current = self.task.current_attempt
        assert (current is not None and current.live) == (self.task.state in LIVE_STATES)

    @invariant()
    def a_cancel_is_delivered_once_at_most(self) -> None:
        assert self.deliveries <= 1
        assert (self.deliveries == 1) == (self.task.cancel_delivered_at is not None)

    @invariant()
    def a_sweep_only_ends_leases_that_had_expired_when_it_decided(self) -> None:
        """Every attempt a sweep ended had lost its lease, or reached its deadline, by the time of
        the decision, judged on the attempt as it was then (renewals included); a timeout only
        when the lease was still held at the deadline, a lease expiry only when it was not."""
        for sweep in self.sweeps:
            attempt, at = sweep.attempt, sweep.decided_at
            for event in sweep.events:
                assert attempt.live and min(attempt.lease_expires_at, attempt.deadline_at) <= at, (attempt, at)
                if isinstance(event, LeaseExpired):
                    assert attempt.lease_expires_at <= at and attempt.lease_expires_at < attempt.deadline_at
                elif isinstance(event, AttemptTimedOut):
                    assert attempt.deadline_at <= at and attempt.deadline_at <= attempt.lease_expires_at
                else:
                    assert isinstance(event, TaskCancelled), event

    @invariant()
    def attempt_count_bounded(self) -> None:
        assert 0 <= self.task.attempt_count <= self.task.max_attempts
        assert self.task.attempt_count == len(self.attempts)


TestTaskMachine = TaskMachine.TestCase
TestTaskMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
