"""An operator's retry of a failed task (domain/task.py ``RetryTask``, domain/scan.py
``reopen_for_retry``) and its projection, and the attempts' ``last_seen_at``: what events a
worker caused set it, and nothing else does."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_projector import fold_both, hash_of, row

from leasehold.domain import events as ev
from leasehold.domain import scan
from leasehold.domain.errors import InvalidRequest, InvalidTransition
from leasehold.domain.task import MAX_ATTEMPTS, Fail, Renew, RequestCancel, RetryTask
from leasehold.projections.projector import project
from leasehold.projections.rows import Insert, Update
from support.refusals import refused
from support.task_states import SCAN_ID, START, TASK_ID, Story, leased, running


def failed(max_attempts: int = 3, *, retryable: bool = False) -> Story:
    story = running(max_attempts=max_attempts)
    story.wait(5).apply(Fail(story.attempt, story.token, error="boom", retryable=retryable))
    assert story.task.state == "failed_terminal"
    return story


def test_a_failed_task_goes_back_to_pending_now_with_a_fresh_budget() -> None:
    story = failed(max_attempts=3)
    (event,) = story.wait(60).apply(RetryTask(reason="fixed"))
    assert isinstance(event, ev.TaskRetried)
    assert (event.reason, event.max_attempts, event.scan_job_id) == ("fixed", 1 + 3, story.task.scan_job_id)
    task = story.task
    assert (task.state, task.attempt_count, task.max_attempts) == ("pending", 1, 4)
    assert (task.available_at, task.updated_at, task.finished_at) == (story.now, story.now, None)
    assert task.last_error == "boom" and task.current_attempt is not None  # history stays
    # It can be leased again: attempt number 2.
    story.lease()
    assert (story.task.state, story.attempt.attempt_number) == ("leased", 2)


def test_the_fresh_budget_can_be_chosen_and_is_bounded() -> None:
    story = failed(max_attempts=1, retryable=True)  # the budget ran out
    assert story.decide(RetryTask(attempts=2))[0].max_attempts == 3  # type: ignore[attr-defined]
    assert story.decide(RetryTask(attempts=MAX_ATTEMPTS - 1))[0].max_attempts == MAX_ATTEMPTS  # type: ignore[attr-defined]
    with pytest.raises(InvalidTransition, match="exceed"):
        story.decide(RetryTask(attempts=MAX_ATTEMPTS))
    with pytest.raises(InvalidRequest):
        story.decide(RetryTask(attempts=0))


def test_a_retry_of_one_attempt_is_allowed_and_fewer_or_too_many_are_refused_exactly() -> None:
    story = failed(max_attempts=1)
    assert story.decide(RetryTask(attempts=1))[0].max_attempts == 2  # type: ignore[attr-defined]
    with refused(InvalidRequest, "attempts must be at least 1"):
        story.decide(RetryTask(attempts=0))
    with refused(InvalidTransition, f"the task has made 1 attempts; {MAX_ATTEMPTS} more would exceed "
                                    f"{MAX_ATTEMPTS} in all") as too_many:
        story.decide(RetryTask(attempts=MAX_ATTEMPTS))
    assert too_many.value.details == {"attempt_count": 1}


def test_a_retry_of_a_task_that_did_not_fail_names_its_state() -> None:
    with refused(InvalidTransition, "only a failed_terminal task can be retried; this one is running") as wrong:
        running().decide(RetryTask())
    assert wrong.value.details == {"state": "running"}


def _cancelling() -> Story:
    story = running()
    story.apply(RequestCancel())
    return story


def _cancelled() -> Story:
    story = Story.create()
    story.apply(RequestCancel())
    return story


@pytest.mark.parametrize("make", [Story.create, leased, running, _cancelling, _cancelled],
                         ids=["pending", "leased", "running", "cancelling", "cancelled"])
def test_only_a_failed_terminal_task_is_retried(make: Callable[[], Story]) -> None:
    story = make()
    with pytest.raises(InvalidTransition, match="failed_terminal"):
        story.decide(RetryTask())


def test_a_failed_scan_reopens_a_running_one_needs_nothing_a_cancelled_one_refuses() -> None:
    (reopened,) = scan.reopen_for_retry(SCAN_ID, 7, "failed", False, task_id=TASK_ID, reason="r", now=START,
                                        actor="operator:k")
    assert (reopened.originator_version, reopened.task_id) == (8, TASK_ID)
    assert scan.reopen_for_retry(SCAN_ID, 7, "running", False, task_id=TASK_ID, reason="r", now=START,
                                 actor="a") == []
    for status, cancel_requested in (("cancelled", False), ("running", True), ("failed", True)):
        with refused(InvalidTransition, "the task's scan was cancelled; its tasks are not retried"):
            scan.reopen_for_retry(SCAN_ID, 7, status, cancel_requested, task_id=TASK_ID, reason="r", now=START,
                                  actor="a")
    (op,) = project(reopened, b"h" * 32)
    assert op.values["status"] == "running" and op.values["finished_at"] is None  # type: ignore[union-attr]


def test_the_projection_of_a_retried_task_matches_the_domain_and_requeues_its_job() -> None:
    story = failed(max_attempts=2)
    story.wait(10).apply(RetryTask())
    story.lease().wait(1).run()
    tables = fold_both(story)  # row == domain state after every event; job status as the rules say
    assert row(tables, "scan_jobs", story.task.scan_job_id)["status"] == "running"
    assert row(tables, "scan_jobs", story.task.scan_job_id)["finished_at"] is None
    assert scan.job_status_after(story.events[-3]) == "queued"


def _attempt_ops(event: ev.DomainEvent) -> list[Insert | Update]:
    return [op for op in project(event, hash_of(event))
            if isinstance(op, Insert | Update) and op.table == "worker_task_attempts"]


def test_last_seen_is_set_by_what_the_worker_caused_only() -> None:
    story = running()
    story.wait(7).apply(Renew(story.attempt, story.token))
    lease, start, renewal = (e.model_copy(update={"actor": "worker:ab"}) for e in story.events[1:])
    (insert,) = _attempt_ops(lease)
    assert isinstance(insert, Insert) and insert.row["last_seen_at"] == START
    for event, at in ((start, START), (renewal, story.now)):
        (update,) = _attempt_ops(event)
        assert isinstance(update, Update) and update.values["last_seen_at"] == at
    # The same events caused by anyone else (here actor "test"; the sweeper, an operator) leave it alone.
    (insert,) = _attempt_ops(story.events[1])
    assert isinstance(insert, Insert) and insert.row["last_seen_at"] is None
    for event in story.events[2:]:
        (update,) = _attempt_ops(event)
        assert isinstance(update, Update) and "last_seen_at" not in update.values
