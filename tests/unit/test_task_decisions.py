"""The task aggregate's decisions (domain/task.py), command by command, at the edges the RFC
draws: who may lease, which writes the fence lets through and why the others are refused, what
is idempotent, and when a failure retries. The random walk over the same rules is in
test_domain_machine.py; these tests pin each rule so that removing it fails a named test."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from uuid import UUID

import pytest

from leasehold.domain.errors import (
    DeadlineExceeded,
    IdempotencyConflict,
    InvalidRequest,
    InvalidTransition,
    LeaseholdError,
    LeaseLost,
    TaskWasCancelled,
)
from leasehold.domain.events import (
    AttemptFailed,
    AttemptRevoked,
    AttemptTimedOut,
    CancelDelivered,
    CancelRequested,
    FairShareGrant,
    LeaseExpired,
    LeaseReissued,
    LeaseRenewed,
    ResultBatchAccepted,
    ScanFinished,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskLeased,
    TaskStarted,
    WriteRejected,
)
from leasehold.domain.limits import MAX_FIELD_DEPTH, TooDeep
from leasehold.domain.retry import RetryPolicy
from leasehold.domain.scan import job_status_after
from leasehold.domain.task import (
    TIMEOUT_ERROR,
    AcknowledgeCancel,
    BatchRecord,
    Complete,
    CreateTask,
    DeliverCancel,
    ExceedDeadline,
    ExpireLease,
    Fail,
    GrantLease,
    MarkRunning,
    ReissueLease,
    Renew,
    RequestCancel,
    RevokeAttempt,
    SubmitBatch,
    TerminateCancelling,
    WorkerWrite,
    decide,
    evolve,
    rejection_error,
)
from support.refusals import refused
from support.task_states import JOB_ID, SCAN_ID, START, TASK_ID, Story, leased, running, token_hash, worker

# --- creation ----------------------------------------------------------------------------------


def test_create_records_the_task_pending_with_its_capabilities_sorted_once() -> None:
    story = Story.create(required_capabilities=("udp", "tcp", "udp"), priority=5, scope={"host": "h"},
                         parameters={"p": 1})
    (created,) = story.events
    assert isinstance(created, TaskCreated)
    assert (created.originator_id, created.originator_version, created.timestamp) == (TASK_ID, 1, START)
    assert created.required_capabilities == ("tcp", "udp")
    assert created.available_at == START  # available at once unless told otherwise
    task = story.task
    assert (task.state, task.attempt_count, task.priority, task.scope, task.parameters) == (
        "pending", 0, 5, {"host": "h"}, {"p": 1})


def test_create_keeps_a_later_availability() -> None:
    later = START + timedelta(hours=1)
    assert Story.create(available_at=later).task.available_at == later


@pytest.mark.parametrize(("field", "low", "high"), [
    ("max_attempts", 1, 100), ("lease_seconds", 1, 3600), ("execution_timeout_seconds", 1, 604800)])
def test_create_bounds_each_limit_inclusively(field: str, low: int, high: int) -> None:
    for ok in (low, high):
        Story.create(**{field: ok})
    for bad in (low - 1, high + 1):
        with refused(InvalidRequest, f"{field} must be between {low} and {high}"):
            Story.create(**{field: bad})


def test_create_needs_a_task_type() -> None:
    with refused(InvalidRequest, "task_type must not be empty"):
        Story.create(task_type="")


def _nested(levels: int) -> dict[str, object]:
    value: dict[str, object] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("field", ["scope", "parameters"])
def test_create_refuses_a_scope_or_parameters_nesting_deeper_than_the_field_limit(field: str) -> None:
    """Whichever way a task is created (an operator's request, a profile step), a value its lease
    answer could not carry is refused here, naming the field."""
    Story.create(**{field: _nested(MAX_FIELD_DEPTH)})
    with refused(TooDeep, f"{field} nests deeper than {MAX_FIELD_DEPTH} levels") as deep:
        Story.create(**{field: _nested(MAX_FIELD_DEPTH + 1)})
    assert deep.value.details == {"field": field, "max_depth": MAX_FIELD_DEPTH}


def test_a_task_is_created_once_and_nothing_else_happens_to_a_task_that_does_not_exist() -> None:
    story = Story.create()
    with refused(InvalidTransition, "task already exists") as again:
        story.decide(CreateTask(task_id=TASK_ID, scan_id=SCAN_ID, scan_job_id=JOB_ID, organization_id=TASK_ID,
                                task_type="probe"))
    assert again.value.details == {"task_id": str(TASK_ID)}
    with refused(InvalidRequest, "the task does not exist yet"):
        decide(None, RequestCancel(), now=START, actor="test")


def test_a_command_the_aggregate_does_not_know_is_a_programming_error() -> None:
    with refused(TypeError, "unknown command 'reboot'"):
        Story.create().decide("reboot")  # type: ignore[arg-type]


def test_an_unknown_worker_write_is_a_programming_error() -> None:
    story = leased()
    with pytest.raises(TypeError, match="^unknown worker write WorkerWrite"):
        story.decide(WorkerWrite(story.attempt, story.token))


# --- acquisition (GrantLease) -------------------------------------------------------------------


def test_lease_gives_the_worker_a_new_attempt_with_lease_and_deadline() -> None:
    story = Story.create(lease_seconds=60, execution_timeout_seconds=600)
    (event,) = story.decide(GrantLease(attempt_id=UUID(int=50), worker=worker(), lease_token_hash=token_hash(5),
                                       request_id="r-1"))
    assert isinstance(event, TaskLeased)
    assert (event.attempt_id, event.worker_id, event.attempt_number) == (UUID(int=50), UUID(int=99), 1)
    assert (event.scan_id, event.scan_job_id, event.request_id) == (SCAN_ID, JOB_ID, "r-1")
    assert event.lease_token_hash == token_hash(5)
    assert event.lease_expires_at == START + timedelta(seconds=60)
    assert event.deadline_at == START + timedelta(seconds=600)
    assert event.originator_version == 2


def test_a_lease_records_the_fair_share_decision_it_was_granted_by() -> None:
    grant = FairShareGrant(organization_id=UUID(int=4), tag=2.0, floor=1.0, virtual_time=3.0, weight=1, live=1,
                           max_live_attempts=None, waited_seconds=0.5)
    (event,) = Story.create().decide(GrantLease(attempt_id=UUID(int=50), worker=worker(),
                                                lease_token_hash=token_hash(5), fair_share=grant))
    assert isinstance(event, TaskLeased) and event.fair_share == grant


def test_a_lease_never_outlives_the_execution_deadline() -> None:
    (event,) = Story.create(lease_seconds=120, execution_timeout_seconds=30).decide(
        GrantLease(attempt_id=UUID(int=50), worker=worker(), lease_token_hash=token_hash(5)))
    assert isinstance(event, TaskLeased)
    assert event.lease_expires_at == event.deadline_at == START + timedelta(seconds=30)


def test_a_worker_without_the_tasks_type_is_not_granted_the_lease() -> None:
    """The worker's task types come from the database; a ``dns``-only worker never gets a ``probe``
    task, even when it has every capability the task needs."""
    story = Story.create(task_type="probe")
    with refused(InvalidTransition, "the worker cannot run this task"):
        story.decide(GrantLease(attempt_id=UUID(int=50), worker=worker(task_types=frozenset({"dns"})),
                                lease_token_hash=token_hash(5)))
    granted = story.decide(GrantLease(attempt_id=UUID(int=50), worker=worker(task_types=frozenset({"probe"})),
                                      lease_token_hash=token_hash(5)))
    assert [type(e) for e in granted] == [TaskLeased]


def test_a_worker_missing_a_required_capability_is_not_granted_the_lease() -> None:
    story = Story.create(required_capabilities=("tcp", "udp"))
    with refused(InvalidTransition, "the worker cannot run this task"):
        story.decide(GrantLease(attempt_id=UUID(int=50), worker=worker(capabilities=frozenset({"tcp"})),
                                lease_token_hash=token_hash(5)))
    more = worker(capabilities=frozenset({"tcp", "udp", "icmp"}))  # more than needed is fine
    assert story.decide(GrantLease(attempt_id=UUID(int=50), worker=more, lease_token_hash=token_hash(5)))


@pytest.mark.parametrize("changes", [{"enabled": False}, {"revoked": True}])
def test_a_disabled_or_revoked_worker_is_not_granted_a_lease(changes: dict[str, bool]) -> None:
    with refused(InvalidTransition, "the worker may not lease tasks"):
        Story.create().decide(GrantLease(attempt_id=UUID(int=50), worker=worker(**changes),
                                         lease_token_hash=token_hash(5)))


def test_a_worker_at_capacity_is_not_granted_a_lease() -> None:
    story = Story.create()
    with refused(InvalidTransition, "the worker is at capacity"):
        story.decide(GrantLease(attempt_id=UUID(int=50), worker=worker(max_concurrent_tasks=2, live_attempts=2),
                                lease_token_hash=token_hash(5)))
    assert story.decide(GrantLease(attempt_id=UUID(int=50), worker=worker(max_concurrent_tasks=2, live_attempts=1),
                                   lease_token_hash=token_hash(5)))


def test_a_task_is_leased_from_the_instant_it_is_available() -> None:
    story = Story.create(available_at=START + timedelta(seconds=10))
    grant = GrantLease(attempt_id=UUID(int=50), worker=worker(), lease_token_hash=token_hash(5))
    with refused(InvalidTransition, "the task is not available yet"):
        story.wait(9.999).decide(grant)
    assert story.wait(0.001).decide(grant)


@pytest.mark.parametrize("state", ["leased", "running", "cancelling", "completed", "cancelled"])
def test_only_a_pending_or_retry_waiting_task_is_leased(state: str) -> None:
    story = leased()
    story.task = replace(story.task, state=state)  # type: ignore[arg-type]
    with refused(InvalidTransition, f"a {state} task cannot be leased"):
        story.decide(GrantLease(attempt_id=UUID(int=50), worker=worker(), lease_token_hash=token_hash(5)))


def test_a_task_without_attempts_left_is_not_leased_again() -> None:
    story = Story.create(max_attempts=2).lease().wait(61)
    story.apply(ExpireLease(story.attempt.id))
    assert story.task.state == "retry_wait"
    story.wait(3600).lease()
    assert story.task.attempt_count == 2 and story.attempt.attempt_number == 2
    story.task = replace(story.task, state="retry_wait")  # as if retried once more
    with refused(InvalidTransition, "the task has no attempts left"):
        story.decide(GrantLease(attempt_id=UUID(int=50), worker=worker(), lease_token_hash=token_hash(5)))


# --- a repeated acquire (ReissueLease) ----------------------------------------------------------

ENDED = "the lease this acquire request created has ended; send a new request_id"


def test_a_repeated_acquire_reissues_the_live_attempt_with_a_fresh_token() -> None:
    story = leased()
    (event,) = story.apply(ReissueLease(story.attempt.id, token_hash(7)))
    assert isinstance(event, LeaseReissued) and event.attempt_id == story.attempt.id
    assert story.token == token_hash(7)
    assert story.run().task.state == "running"
    assert story.decide(ReissueLease(story.attempt.id, token_hash(8)))  # running still counts


def test_a_repeated_acquire_after_the_lease_ended_is_refused() -> None:
    story = leased()
    with refused(LeaseLost, ENDED):
        story.decide(ReissueLease(UUID(int=7), token_hash(7)))  # another attempt
    with refused(LeaseLost, ENDED):
        story.wait(60).decide(ReissueLease(story.attempt.id, token_hash(7)))  # expired at this instant
    story.now = START
    story.apply(RequestCancel())
    with refused(LeaseLost, ENDED):
        story.decide(ReissueLease(story.attempt.id, token_hash(7)))  # cancelling
    finished = running().batch(1, final=True)
    finished.apply(Complete(finished.attempt, finished.token))
    with refused(LeaseLost, ENDED):
        finished.decide(ReissueLease(finished.attempt.id, token_hash(7)))
    cancelled = leased()
    cancelled.task = replace(cancelled.task, state="leased",
                             current_attempt=replace(cancelled.attempt, status="expired"))
    with refused(LeaseLost, ENDED):
        cancelled.decide(ReissueLease(cancelled.attempt.id, token_hash(7)))


# --- the fence: which worker writes get through ----------------------------------------------------


def _rejection(events: list[object], command: str | None = None) -> str:
    """The reason of the one ``WriteRejected`` event (recorded for ``command``, when given)."""
    (event,) = events
    assert isinstance(event, WriteRejected)
    assert command is None or event.command == command, event.command
    return event.reason


def test_a_write_with_the_wrong_token_is_refused_as_bad_token() -> None:
    story = leased()
    assert _rejection(story.decide(MarkRunning(story.attempt, token_hash(0)))) == "bad_token"


def test_a_write_of_a_superseded_attempt_is_refused() -> None:
    story = leased().wait(61)
    old = story.attempt
    story.apply(ExpireLease(old.id))
    story.wait(3600).lease()
    event = story.decide(MarkRunning(old, old.lease_token_hash))
    assert _rejection(event) == "superseded"
    assert event[0].attempt_id == old.id and event[0].command == "progress"


def test_a_write_once_the_lease_has_run_out_is_refused_at_that_very_instant() -> None:
    story = leased()
    assert story.wait(59.999).decide(MarkRunning(story.attempt, story.token))
    assert _rejection(story.wait(0.001).decide(MarkRunning(story.attempt, story.token))) == "lease_expired"


def test_a_write_of_an_expired_attempt_is_refused_as_lease_expired() -> None:
    story = leased().wait(61)
    story.apply(ExpireLease(story.attempt.id))
    assert story.attempt.status == "expired"
    assert _rejection(story.decide(Renew(story.attempt, story.token))) == "lease_expired"


def test_a_write_of_a_failed_attempt_is_refused_as_finished() -> None:
    story = running()
    story.apply(Fail(story.attempt, story.token, error="boom"))
    assert _rejection(story.decide(Renew(story.attempt, story.token))) == "finished"


def renewed_to_the_deadline(story: Story) -> Story:
    """Renew on time (every half lease) until the lease is capped at the execution deadline."""
    while story.attempt.lease_expires_at < story.attempt.deadline_at:
        story.wait(story.task.lease_seconds / 2).apply(Renew(story.attempt, story.token))
    return story


def test_a_write_at_the_deadline_of_an_attempt_renewed_on_time_is_refused_as_deadline_passed() -> None:
    """The lease runs exactly up to the deadline, so at that instant both have passed: the
    deadline is the reason (the attempt did not lose its lease, it ran out of time)."""
    story = renewed_to_the_deadline(running(lease_seconds=60, execution_timeout_seconds=100))
    assert story.attempt.lease_expires_at == story.attempt.deadline_at == START + timedelta(seconds=100)
    story.now = story.attempt.deadline_at - timedelta(milliseconds=1)
    assert isinstance(story.decide(Renew(story.attempt, story.token))[0], LeaseRenewed)
    assert _rejection(story.wait(0.001).decide(Renew(story.attempt, story.token))) == "deadline_passed"
    assert _rejection(story.decide(MarkRunning(story.attempt, story.token))) == "deadline_passed"


def test_a_write_after_a_lease_that_lapsed_before_the_deadline_is_refused_as_lease_expired() -> None:
    story = running(lease_seconds=60, execution_timeout_seconds=600).wait(700)  # past both
    assert _rejection(story.decide(Renew(story.attempt, story.token))) == "lease_expired"


def test_a_write_of_a_timed_out_attempt_is_refused_as_deadline_passed() -> None:
    story = renewed_to_the_deadline(running(lease_seconds=60, execution_timeout_seconds=100))
    story.now = story.attempt.deadline_at
    story.apply(ExceedDeadline(story.attempt.id))
    assert story.attempt.status == "timeout"
    assert _rejection(story.decide(Fail(story.attempt, story.token, error="late"))) == "deadline_passed"


def test_a_write_to_a_cancelling_task_is_refused_as_cancelled() -> None:
    story = running()
    story.apply(RequestCancel())
    assert _rejection(story.decide(MarkRunning(story.attempt, story.token))) == "cancelled"
    # Renew is let through, not extended; its answer hands the cancel over, on the record once.
    [delivered] = story.decide(Renew(story.attempt, story.token))
    assert isinstance(delivered, CancelDelivered)
    assert (delivered.attempt_id, delivered.channel) == (story.attempt.id, "renew")
    story.apply(Renew(story.attempt, story.token))
    assert story.task.state == "cancelling" and story.task.cancel_delivered_at == story.now
    assert story.decide(Renew(story.attempt, story.token)) == []
    assert story.decide(DeliverCancel(story.attempt.id, "long-poll")) == []


def test_a_cancel_is_delivered_once_and_only_to_the_live_attempt_of_a_cancelling_task() -> None:
    story = running()
    assert story.decide(DeliverCancel(story.attempt.id, "long-poll")) == []  # nothing to deliver yet
    story.apply(RequestCancel())
    assert story.decide(DeliverCancel(UUID(int=999), "long-poll")) == []  # not this task's attempt
    [delivered] = story.decide(DeliverCancel(story.attempt.id, "long-poll"))
    assert isinstance(delivered, CancelDelivered) and delivered.channel == "long-poll"
    story.apply(DeliverCancel(story.attempt.id, "long-poll"))
    assert story.decide(DeliverCancel(story.attempt.id, "renew")) == []
    story.apply(AcknowledgeCancel(story.attempt, story.token))
    assert story.decide(DeliverCancel(story.attempt.id, "long-poll")) == []


def test_revoking_an_attempt_frees_the_task_at_once_without_backoff() -> None:
    story = running()
    [revoked] = story.decide(RevokeAttempt(story.attempt.id, "worker disabled"))
    assert isinstance(revoked, AttemptRevoked)
    assert (revoked.outcome, revoked.available_at, revoked.reason) == ("retry_wait", story.now, "worker disabled")
    story.apply(RevokeAttempt(story.attempt.id, "worker disabled"))
    assert story.task.state == "retry_wait" and story.task.current_attempt is not None
    assert story.task.current_attempt.status == "cancelled"
    assert story.decide(RevokeAttempt(story.attempt.id, "again")) == []  # repeated: nothing
    assert _rejection(story.decide(Renew(story.attempt, story.token))) == "finished"


def test_revoking_the_last_attempt_fails_the_task_and_a_cancelling_one_ends_cancelled() -> None:
    story = running(max_attempts=1)
    [revoked] = story.decide(RevokeAttempt(story.attempt.id, "worker disabled"))
    assert isinstance(revoked, AttemptRevoked) and revoked.outcome == "failed_terminal"
    assert revoked.available_at is None
    cancelling = running()
    cancelling.apply(RequestCancel())
    [ended] = cancelling.decide(RevokeAttempt(cancelling.attempt.id, "worker disabled"))
    assert isinstance(ended, TaskCancelled) and ended.attempt_id == cancelling.attempt.id


def test_a_write_to_a_cancelled_task_is_refused_as_cancelled() -> None:
    story = running()
    story.apply(RequestCancel())
    story.apply(AcknowledgeCancel(story.attempt, story.token))
    assert _rejection(story.decide(Renew(story.attempt, story.token))) == "cancelled"


def test_a_refused_write_changes_nothing_but_the_version() -> None:
    story = leased()
    before = story.task
    story.apply(MarkRunning(story.attempt, token_hash(0)))
    assert story.task == replace(before, version=before.version + 1)


@pytest.mark.parametrize(("reason", "error"), [
    ("superseded", LeaseLost), ("bad_token", LeaseLost), ("lease_expired", LeaseLost), ("finished", LeaseLost),
    ("cancelled", TaskWasCancelled), ("deadline_passed", DeadlineExceeded),
    ("idempotency_conflict", IdempotencyConflict), ("not_started", InvalidTransition),
    ("final_missing", InvalidTransition), ("out_of_order", InvalidTransition)])
def test_each_recorded_rejection_answers_with_its_own_error(reason: str, error: type[LeaseholdError]) -> None:
    event = WriteRejected(originator_id=TASK_ID, originator_version=3, timestamp=START, actor="test",
                          command="renew", attempt_id=UUID(int=5), reason=reason)  # type: ignore[arg-type]
    raised = rejection_error(event)
    assert type(raised) is error
    assert raised.details == {"reason": reason, "attempt_id": str(UUID(int=5))}
    assert raised.message and raised.message != error.__doc__


# --- progress and renewal ----------------------------------------------------------------------------


def test_progress_starts_a_leased_task_and_repeating_it_changes_nothing() -> None:
    story = leased()
    (event,) = story.apply(MarkRunning(story.attempt, story.token))
    assert isinstance(event, TaskStarted) and event.attempt_id == story.attempt.id
    assert story.task.state == "running" and story.attempt.status == "running"
    assert story.attempt.started_at == START
    assert story.decide(MarkRunning(story.attempt, story.token)) == []


def test_a_repeated_progress_after_the_lease_ran_out_is_refused() -> None:
    story = running().wait(60)
    assert _rejection(story.decide(MarkRunning(story.attempt, story.token))) == "lease_expired"


def test_renewal_extends_the_lease_from_now_but_not_past_the_deadline() -> None:
    story = running(lease_seconds=60, execution_timeout_seconds=100).wait(30)
    (event,) = story.apply(Renew(story.attempt, story.token))
    assert isinstance(event, LeaseRenewed) and event.attempt_id == story.attempt.id
    assert story.attempt.lease_expires_at == START + timedelta(seconds=90)
    story.wait(30).apply(Renew(story.attempt, story.token))
    assert story.attempt.lease_expires_at == START + timedelta(seconds=100)  # the deadline


def test_renewal_of_a_stale_lease_is_refused_as_renew() -> None:
    story = running()
    (event,) = story.decide(Renew(story.attempt, token_hash(0)))
    assert isinstance(event, WriteRejected) and event.command == "renew"


# --- result batches ----------------------------------------------------------------------------------


def _batch(story: Story, sequence_number: int, *, key: str = "k", sha: str = "ab" * 32, final: bool = False,
           records: int = 1, existing: BatchRecord | None = None, token: str | None = None) -> SubmitBatch:
    return SubmitBatch(story.attempt, story.token if token is None else token, batch_id=UUID(int=77),
                       sequence_number=sequence_number, idempotency_key=key, payload_sha256=sha,
                       record_count=records, final=final, existing=existing)


def test_the_first_batch_of_a_leased_task_starts_it() -> None:
    story = leased()
    started, accepted = story.apply(_batch(story, 1, key="k1", records=0, final=True))
    assert isinstance(started, TaskStarted) and isinstance(accepted, ResultBatchAccepted)
    assert (accepted.batch_id, accepted.sequence_number, accepted.idempotency_key, accepted.record_count,
            accepted.final, accepted.payload_sha256) == (UUID(int=77), 1, "k1", 0, True, "ab" * 32)
    assert (started.originator_version, accepted.originator_version) == (3, 4)
    assert story.task.state == "running"
    assert (story.attempt.batch_count, story.attempt.final_batch_accepted) == (1, True)


def test_a_batch_of_a_running_task_is_accepted_alone() -> None:
    story = running()
    assert [type(e) for e in story.apply(_batch(story, 1))] == [ResultBatchAccepted]
    assert [type(e) for e in story.apply(_batch(story, 2, key="k2"))] == [ResultBatchAccepted]
    assert story.attempt.batch_count == 2 and not story.attempt.final_batch_accepted


@pytest.mark.parametrize("key", ["", "k" * 201])
def test_an_idempotency_key_has_one_to_two_hundred_characters(key: str) -> None:
    story = running()
    with refused(InvalidRequest, "idempotency_key must be 1..200 characters"):
        story.decide(_batch(story, 1, key=key))
    assert story.decide(_batch(story, 1, key="k" * 200))


def test_sequence_numbers_start_at_one_and_record_counts_are_not_negative() -> None:
    story = running()
    for bad in (_batch(story, 0), _batch(story, 1, records=-1)):
        with refused(InvalidRequest, "sequence_number starts at 1; record_count cannot be negative"):
            story.decide(bad)


def test_batches_are_accepted_in_sequence_only() -> None:
    story = running()
    assert _rejection(story.decide(_batch(story, 2)), "results") == "out_of_order"
    story.batch(1)
    assert _rejection(story.decide(_batch(story, 1, key="again")), "results") == "out_of_order"


def test_no_batch_is_accepted_after_the_final_one() -> None:
    story = running().batch(1, final=True)
    assert _rejection(story.decide(_batch(story, 2, key="late")), "results") == "finished"


def test_a_stale_batch_is_refused_as_results() -> None:
    story = running()
    (event,) = story.decide(_batch(story, 1, token=token_hash(0)))
    assert isinstance(event, WriteRejected) and (event.command, event.reason) == ("results", "bad_token")


def test_a_batch_resent_with_its_key_and_payload_is_acknowledged_again_without_events() -> None:
    story = running()
    stored = BatchRecord(batch_id=UUID(int=77), attempt_id=story.attempt.id, sequence_number=1,
                         idempotency_key="k", payload_sha256="ab" * 32, record_count=1, final=False,
                         accepted_at=START)
    story.batch(1)
    assert story.decide(_batch(story, 1, existing=stored)) == []


def test_a_known_key_with_another_payload_or_from_another_attempt_is_an_idempotency_conflict() -> None:
    story = running()
    stored = BatchRecord(batch_id=UUID(int=77), attempt_id=story.attempt.id, sequence_number=1,
                         idempotency_key="k", payload_sha256="ab" * 32, record_count=1, final=False,
                         accepted_at=START)
    assert _rejection(story.decide(_batch(story, 1, sha="cd" * 32, existing=stored)), "results") == \
        "idempotency_conflict"
    other = replace(stored, attempt_id=UUID(int=5))
    assert _rejection(story.decide(_batch(story, 1, existing=other))) == "idempotency_conflict"
    assert _rejection(story.decide(_batch(story, 1, existing=stored, token=token_hash(0)))) == \
        "idempotency_conflict"


# --- completion -----------------------------------------------------------------------------------------


def test_complete_needs_an_accepted_final_batch() -> None:
    story = running().batch(1)
    assert _rejection(story.decide(Complete(story.attempt, story.token)), "complete") == "final_missing"
    story.batch(2, final=True)
    (event,) = story.apply(Complete(story.attempt, story.token))
    assert isinstance(event, TaskCompleted) and (event.scan_job_id, event.attempt_id) == (JOB_ID, story.attempt.id)
    assert story.task.state == "completed" and story.attempt.status == "succeeded"
    assert story.task.finished_at == story.attempt.finished_at == START


def test_a_repeated_completion_changes_nothing_but_a_stale_one_is_refused() -> None:
    story = running().batch(1, final=True)
    story.apply(Complete(story.attempt, story.token))
    assert story.decide(Complete(story.attempt, story.token)) == []
    (event,) = story.decide(Complete(story.attempt, token_hash(0)))
    assert isinstance(event, WriteRejected) and (event.command, event.reason) == ("complete", "bad_token")


# --- failure and retry -------------------------------------------------------------------------------------


def test_a_retryable_failure_waits_the_backoff_of_the_attempt_number() -> None:
    story = running()
    (event,) = story.apply(Fail(story.attempt, story.token, error="boom"), draw=0.0)
    assert isinstance(event, AttemptFailed)
    assert (event.outcome, event.reason, event.retryable, event.job_status) == ("retry_wait", "worker", True, None)
    assert event.available_at == START + timedelta(seconds=2)  # attempt 1, no jitter
    assert story.task.state == "retry_wait" and story.task.available_at == event.available_at
    assert story.task.last_error == "boom" and story.attempt.error == "boom" and story.attempt.status == "failed"
    assert story.task.finished_at is None
    story.wait(2).lease().run()
    (second,) = story.decide(Fail(story.attempt, story.token, error="boom"), draw=0.5)
    assert isinstance(second, AttemptFailed)
    assert second.available_at == story.now + timedelta(seconds=3)  # 4 s less a quarter


def test_without_a_draw_the_retry_waits_three_quarters_of_the_backoff() -> None:
    """``decide``'s default draw is 0.5: halfway into the jitter (2 s less a quarter, attempt 1)."""
    story = running()
    (event,) = decide(story.task, Fail(story.attempt, story.token, error="x"), now=START, actor="test")
    assert isinstance(event, AttemptFailed) and event.available_at == START + timedelta(seconds=1.5)


def test_the_tasks_retry_policy_decides_the_delay() -> None:
    story = running()
    (event,) = decide(story.task, Fail(story.attempt, story.token, error="x"), now=START, actor="test", draw=0.0,
                      retry_policy=RetryPolicy(base_seconds=10, cap_seconds=10, jitter=0))
    assert isinstance(event, AttemptFailed) and event.available_at == START + timedelta(seconds=10)


def test_a_failure_of_the_last_attempt_is_terminal() -> None:
    story = running(max_attempts=1)
    (event,) = story.apply(Fail(story.attempt, story.token, error="boom"))
    assert isinstance(event, AttemptFailed)
    assert (event.outcome, event.available_at, event.job_status) == ("failed_terminal", None, "failed")
    assert story.task.state == "failed_terminal" and story.task.finished_at == START


def test_a_failure_that_is_not_retryable_is_terminal_with_attempts_left() -> None:
    story = running(max_attempts=3)
    (event,) = story.apply(Fail(story.attempt, story.token, error="bad target", retryable=False))
    assert isinstance(event, AttemptFailed)
    assert (event.outcome, event.retryable, event.job_status) == ("failed_terminal", False, "failed")


def test_a_failure_keeps_the_last_4000_characters_of_the_error() -> None:
    story = running()
    (event,) = story.decide(Fail(story.attempt, story.token, error="a" * 10 + "b" * 4000))
    assert isinstance(event, AttemptFailed) and event.error == "b" * 4000


def test_a_repeated_failure_changes_nothing_but_a_stale_one_is_refused() -> None:
    story = running()
    story.apply(Fail(story.attempt, story.token, error="boom"))
    assert story.decide(Fail(story.attempt, story.token, error="boom")) == []
    (event,) = story.decide(Fail(story.attempt, token_hash(0), error="boom"))
    assert isinstance(event, WriteRejected) and (event.command, event.reason) == ("fail", "bad_token")


# --- cancellation ---------------------------------------------------------------------------------------------


def test_cancelling_a_task_that_waits_for_a_worker_cancels_it_at_once() -> None:
    story = Story.create()
    (event,) = story.apply(RequestCancel(reason="operator"))
    assert isinstance(event, TaskCancelled)
    assert (event.attempt_id, event.reason, event.scan_job_id) == (None, "operator", JOB_ID)
    assert story.task.state == "cancelled" and story.task.cancel_requested_at == START


def test_cancelling_a_task_in_retry_wait_cancels_it_at_once() -> None:
    story = leased().wait(61)
    story.apply(ExpireLease(story.attempt.id))
    assert [type(e) for e in story.apply(RequestCancel())] == [TaskCancelled]
    assert story.attempt.status == "expired"  # the ended attempt stays as it ended


@pytest.mark.parametrize("build", [leased, running])
def test_cancelling_a_leased_or_running_task_asks_its_worker_first(build: Callable[[], Story]) -> None:
    story = build().wait(5)
    (event,) = story.apply(RequestCancel(reason="operator"))
    assert isinstance(event, CancelRequested) and event.reason == "operator"
    assert story.task.state == "cancelling" and story.task.cancel_requested_at == START + timedelta(seconds=5)
    assert story.decide(RequestCancel()) == []  # repeated


def test_cancelling_a_finished_task_changes_nothing() -> None:
    story = running(max_attempts=1)
    story.apply(Fail(story.attempt, story.token, error="boom"))
    assert story.decide(RequestCancel()) == []


def test_the_worker_acknowledges_a_cancel_even_after_its_lease_ran_out() -> None:
    story = running()
    story.apply(RequestCancel())
    story.wait(3600)
    (event,) = story.apply(AcknowledgeCancel(story.attempt, story.token))
    assert isinstance(event, TaskCancelled)
    assert (event.attempt_id, event.reason) == (story.attempt.id, "acknowledged by worker")
    assert story.task.state == "cancelled" and story.attempt.status == "cancelled"
    assert story.task.cancel_requested_at == START  # the request's time, not the acknowledgement's
    assert story.decide(AcknowledgeCancel(story.attempt, story.token)) == []  # repeated


def test_a_cancel_is_acknowledged_even_when_the_fence_says_the_deadline_passed() -> None:
    """Only a state built by hand has a lease beyond the deadline (see the fence's own test); the
    acknowledgement of a requested cancel goes through it, as it does an expired lease."""
    story = running()
    story.apply(RequestCancel())
    story.task = replace(story.task, current_attempt=replace(
        story.attempt, lease_expires_at=START + timedelta(seconds=100), deadline_at=START + timedelta(seconds=50)))
    (event,) = story.wait(60).decide(AcknowledgeCancel(story.attempt, story.token))
    assert isinstance(event, TaskCancelled)


def test_a_cancel_acknowledgement_with_the_wrong_token_is_refused() -> None:
    story = running()
    story.apply(RequestCancel())
    (event,) = story.decide(AcknowledgeCancel(story.attempt, token_hash(0)))
    assert isinstance(event, WriteRejected) and (event.command, event.reason) == ("cancel-ack", "bad_token")


def test_acknowledging_a_cancel_nobody_requested_is_refused() -> None:
    story = running()
    with refused(InvalidTransition, "no cancellation was requested for this task"):
        story.decide(AcknowledgeCancel(story.attempt, story.token))
    assert _rejection(story.decide(AcknowledgeCancel(story.attempt, token_hash(0))), "cancel-ack") == "bad_token"


def test_an_unacknowledged_cancel_is_terminated_once_the_grace_has_passed() -> None:
    story = running()
    story.apply(RequestCancel())
    grace = TerminateCancelling(timedelta(seconds=30))
    assert story.wait(29.999).decide(grace) == []
    (event,) = story.wait(0.001).apply(grace)
    assert isinstance(event, TaskCancelled) and event.attempt_id == story.attempt.id
    assert event.reason == "not acknowledged in time; terminated by the gateway"
    assert story.task.state == "cancelled"
    assert story.decide(grace) == []  # nothing left to terminate


def test_terminating_a_cancel_names_no_attempt_once_the_attempt_has_ended() -> None:
    story = running()
    story.apply(RequestCancel())
    story.task = replace(story.task, current_attempt=replace(story.attempt, status="expired"))
    (event,) = story.wait(60).decide(TerminateCancelling(timedelta(seconds=30)))
    assert isinstance(event, TaskCancelled) and event.attempt_id is None


def test_only_a_cancelling_task_is_terminated() -> None:
    assert running().wait(3600).decide(TerminateCancelling(timedelta(seconds=1))) == []


# --- the sweeper -------------------------------------------------------------------------------------------------


def test_an_expired_lease_sends_the_task_to_retry_after_the_backoff() -> None:
    story = leased()
    assert story.wait(59.999).decide(ExpireLease(story.attempt.id)) == []
    (event,) = story.wait(0.001).apply(ExpireLease(story.attempt.id), draw=0.0)
    assert isinstance(event, LeaseExpired)
    assert (event.outcome, event.available_at, event.scan_job_id) == (
        "retry_wait", START + timedelta(seconds=62), JOB_ID)
    assert story.task.state == "retry_wait" and story.task.last_error == "lease expired"
    assert story.attempt.status == "expired" and story.attempt.finished_at == story.now


def test_an_expired_lease_of_the_last_attempt_fails_the_task() -> None:
    story = leased(max_attempts=1).wait(60)
    (event,) = story.apply(ExpireLease(story.attempt.id))
    assert isinstance(event, LeaseExpired) and (event.outcome, event.available_at) == ("failed_terminal", None)
    assert story.task.state == "failed_terminal" and story.task.finished_at == story.now


def test_an_expired_lease_of_a_cancelling_task_cancels_it() -> None:
    story = leased()
    story.apply(RequestCancel())
    (event,) = story.wait(60).apply(ExpireLease(story.attempt.id))
    assert isinstance(event, TaskCancelled) and event.reason == "lease expired while cancelling"
    assert event.attempt_id == story.attempt.id


def test_the_sweeper_leaves_other_and_ended_attempts_alone() -> None:
    story = leased().wait(60)
    assert story.decide(ExpireLease(UUID(int=5))) == []
    assert story.decide(ExceedDeadline(UUID(int=5))) == []
    story.apply(ExpireLease(story.attempt.id))
    assert story.decide(ExpireLease(story.attempt.id)) == []


def test_a_sweep_leaves_alone_a_lease_renewed_since_the_sweeper_listed_it() -> None:
    """A sweeper lists lapsed leases from a snapshot; by the time it decides on the task (locked,
    read afresh), the worker may have renewed: the old lease end has passed, the new one has not."""
    story = running(lease_seconds=60)
    story.wait(59).apply(Renew(story.attempt, story.token))
    story.wait(2)  # past the lease end the sweeper's listing saw, inside the renewed one
    assert story.decide(ExpireLease(story.attempt.id)) == []
    assert story.decide(ExceedDeadline(story.attempt.id)) == []
    (event,) = story.wait(58).decide(ExpireLease(story.attempt.id))  # the renewed lease ran out
    assert isinstance(event, LeaseExpired)


@pytest.mark.parametrize("sweep", [ExceedDeadline, ExpireLease])
def test_an_attempt_renewed_up_to_its_deadline_times_out_and_is_not_retried(sweep: type) -> None:
    """Either sweep finds it (the lease ends at the deadline): a timeout, terminal although
    attempts remain, with the job ``timeout``."""
    story = renewed_to_the_deadline(running(lease_seconds=60, execution_timeout_seconds=100, max_attempts=3))
    assert story.decide(ExceedDeadline(story.attempt.id)) == []  # not yet
    story.now = story.attempt.deadline_at + timedelta(seconds=5)
    (event,) = story.apply(sweep(story.attempt.id))
    assert isinstance(event, AttemptTimedOut)
    assert (event.attempt_id, event.deadline_at, event.scan_job_id) == (
        story.attempt.id, START + timedelta(seconds=100), JOB_ID)
    assert job_status_after(event) == "timeout"
    task = story.task
    assert (task.state, task.last_error, task.finished_at) == ("failed_terminal", TIMEOUT_ERROR, story.now)
    assert (story.attempt.status, story.attempt.error, story.attempt.finished_at) == (
        "timeout", TIMEOUT_ERROR, story.now)
    assert story.decide(sweep(story.attempt.id)) == []  # safe to repeat


@pytest.mark.parametrize("sweep", [ExceedDeadline, ExpireLease])
def test_a_lease_lost_before_the_deadline_expires_even_when_swept_after_the_deadline(sweep: type) -> None:
    """Lease expiry stays the recovery path: which limit came first decides, not the sweep's time."""
    story = running(lease_seconds=60, execution_timeout_seconds=600, max_attempts=2).wait(601)
    (event,) = story.decide(sweep(story.attempt.id), draw=0.0)
    assert isinstance(event, LeaseExpired)
    assert (event.outcome, event.available_at) == ("retry_wait", story.now + timedelta(seconds=2))


def test_a_deadline_reached_while_cancelling_cancels_the_task() -> None:
    story = renewed_to_the_deadline(running(lease_seconds=60, execution_timeout_seconds=100))
    story.apply(RequestCancel())
    story.now = story.attempt.deadline_at
    (event,) = story.decide(ExceedDeadline(story.attempt.id))
    assert isinstance(event, TaskCancelled) and event.reason == "execution deadline passed while cancelling"
    assert event.attempt_id == story.attempt.id


def test_evolve_refuses_an_event_of_another_stream() -> None:
    with refused(TypeError, "ScanFinished is not a task event"):
        evolve(ScanFinished(originator_id=SCAN_ID, originator_version=2, timestamp=START, actor="t",
                            status="success"), None)
