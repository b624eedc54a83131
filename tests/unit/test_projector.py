"""The projector (projections/projector.py): each event's row changes, checked against the domain.

Task streams are folded twice, by the domain's ``evolve`` and by the projector into in-memory
tables, and after every event the columns both know must agree (the task, its current attempt,
and the job status that ``domain.scan.job_status_after`` says the event implies). Worker streams
are checked the same way against ``domain.registry.evolve_worker``. The other streams' rows are
checked column by column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest

from leasehold.domain import admission, fairness, profiles, registry, scan, schedule, targets
from leasehold.domain import events as ev
from leasehold.domain.task import (
    AcknowledgeCancel,
    AttemptState,
    Complete,
    DeliverCancel,
    ExceedDeadline,
    ExpireLease,
    Fail,
    MarkRunning,
    ReissueLease,
    Renew,
    RequestCancel,
    RevokeAttempt,
    TaskState,
    TerminateCancelling,
    evolve,
)
from leasehold.gateway.commands.scans import profile_steps
from leasehold.projections.memory import MemoryTables
from leasehold.projections.projector import project
from leasehold.projections.rows import PRIMARY_KEYS, Insert, Row, Update
from support.task_states import JOB_ID, ORG_ID, SCAN_ID, START, TASK_ID, Story, token_hash

HASH = b"\x07" * 32


def hash_of(event: ev.DomainEvent) -> bytes:
    """A stand-in chain hash that differs per event, so a stale ``head_hash`` shows."""
    return event.originator_version.to_bytes(4, "big") * 8


def scan_with_job() -> MemoryTables:
    tables = MemoryTables()
    created = scan.create_scan(SCAN_ID, ORG_ID, {"targets": ["h"]}, "gateway", now=START, actor="test")
    queued = scan.queue_job(SCAN_ID, 1, "pending", organization_id=ORG_ID, job_id=JOB_ID, position=0,
                            plugin="probe", execution_mode="gateway", now=START, actor="test")
    for event in (created, queued):
        tables.apply(project(event, hash_of(event)))
    return tables


def row(tables: MemoryTables, table: str, *key: Any) -> Row:
    return tables.tables[table][tuple(key)]


def assert_task_row_matches(task_row: Row, task: TaskState, head: bytes) -> None:
    expected = {
        "id": task.id, "scan_id": task.scan_id, "scan_job_id": task.scan_job_id,
        "organization_id": task.organization_id, "task_type": task.task_type,
        "required_capabilities": list(task.required_capabilities), "priority": task.priority, "scope": task.scope,
        "parameters": task.parameters, "state": task.state, "available_at": task.available_at,
        "attempt_count": task.attempt_count, "max_attempts": task.max_attempts, "lease_seconds": task.lease_seconds,
        "execution_timeout_seconds": task.execution_timeout_seconds, "created_at": task.created_at,
        "updated_at": task.updated_at, "cancel_requested_at": task.cancel_requested_at,
        "last_error": task.last_error, "finished_at": task.finished_at, "version": task.version,
        "current_attempt_id": task.current_attempt.id if task.current_attempt else None, "head_hash": head,
        "cancel_delivered_at": task.cancel_delivered_at, "cancel_delivery_channel": task.cancel_delivery_channel,
        "scope_ref": None if task.scope_ref is None else task.scope_ref.to_json(),
        "scope_pages": None,  # these scopes fit their row (tests/core/test_scopes.py pages larger ones)
    }
    # When the worker acknowledged a cancellation is the analysts' column alone (not in the state).
    assert {k: v for k, v in task_row.items() if k != "cancel_acknowledged_at"} == expected


def assert_attempt_row_matches(attempt_row: Row, attempt: AttemptState) -> None:
    expected = {
        "id": attempt.id, "task_id": attempt.task_id, "worker_id": attempt.worker_id,
        "attempt_number": attempt.attempt_number, "lease_token_hash": bytes.fromhex(attempt.lease_token_hash),
        "status": attempt.status, "leased_at": attempt.leased_at, "lease_expires_at": attempt.lease_expires_at,
        "deadline_at": attempt.deadline_at, "started_at": attempt.started_at, "finished_at": attempt.finished_at,
        "batch_count": attempt.batch_count, "final_batch_accepted": attempt.final_batch_accepted,
        "error": attempt.error,
    }
    assert {c: attempt_row[c] for c in expected} == expected


def fold_both(story: Story) -> MemoryTables:
    """Project the story's events one by one and compare with the domain's state after each."""
    tables = scan_with_job()
    task: TaskState | None = None
    last_seen: dict[UUID, AttemptState] = {}
    job_status = "queued"
    for event in story.events:
        task = evolve(event, task)
        tables.apply(project(event, hash_of(event)))
        assert_task_row_matches(row(tables, "worker_tasks", TASK_ID), task, hash_of(event))
        if task.current_attempt is not None:
            last_seen[task.current_attempt.id] = task.current_attempt
        for attempt_id, attempt in last_seen.items():  # earlier attempts keep their last state
            assert_attempt_row_matches(row(tables, "worker_task_attempts", attempt_id), attempt)
        job_status = scan.job_status_after(event) or job_status
        assert row(tables, "scan_jobs", JOB_ID)["status"] == job_status
    assert len(tables.tables["worker_task_attempts"]) == len(last_seen)
    return tables


def _completed(story: Story) -> None:
    story.wait(1).run().wait(1).apply(Renew(story.attempt, story.token))
    story.wait(1).batch(1).wait(1).batch(2, final=True).wait(1)
    story.apply(Complete(story.attempt, story.token))


def _retried_then_failed(story: Story) -> None:
    story.wait(61).apply(ExpireLease(story.attempt.id), draw=0.0)
    story.wait(60).lease().wait(5).run()
    story.apply(MarkRunning(story.attempt, token_hash(0)))  # refused: changes the version only
    story.wait(5).apply(Fail(story.attempt, story.token, error="boom"), draw=0.3)
    story.wait(60).lease().wait(601).apply(ExceedDeadline(story.attempt.id))


def _timed_out(story: Story) -> None:
    story.wait(1).run()
    while story.attempt.lease_expires_at < story.attempt.deadline_at:  # renewed on time up to the deadline
        story.wait(30).apply(Renew(story.attempt, story.token))
    story.now = story.attempt.deadline_at
    story.apply(ExceedDeadline(story.attempt.id))
    assert story.attempt.status == "timeout"


def _cancelled_while_running(story: Story) -> None:
    story.apply(ReissueLease(story.attempt.id, token_hash(9)))
    story.wait(2).run().wait(2).apply(RequestCancel(reason="operator"))
    story.wait(2).apply(AcknowledgeCancel(story.attempt, story.token))


def _cancel_terminated(story: Story) -> None:
    story.wait(2).apply(RequestCancel())
    story.wait(31).apply(TerminateCancelling(timedelta(seconds=30)))


def _cancelled_in_retry_wait(story: Story) -> None:
    story.wait(3).run().apply(Fail(story.attempt, story.token, error="x"))
    story.wait(1).apply(RequestCancel())


def _cancel_delivered_on_renew_then_acknowledged(story: Story) -> None:
    story.wait(1).run().wait(1).apply(RequestCancel())
    story.wait(1).apply(Renew(story.attempt, story.token))
    story.wait(1).apply(Renew(story.attempt, story.token))  # delivered again: nothing recorded
    story.wait(1).apply(AcknowledgeCancel(story.attempt, story.token))


def _cancel_delivered_on_long_poll_then_terminated(story: Story) -> None:
    story.wait(2).apply(RequestCancel())
    story.wait(1).apply(DeliverCancel(story.attempt.id, "long-poll"))
    story.wait(31).apply(TerminateCancelling(timedelta(seconds=30)))


def _revoked_then_completed_elsewhere(story: Story) -> None:
    story.wait(1).run().wait(1).apply(RevokeAttempt(story.attempt.id, "worker disabled"))
    story.lease().wait(1).run().wait(1).batch(1, final=True)
    story.apply(Complete(story.attempt, story.token))


def _revoked_on_the_last_attempt(story: Story) -> None:
    story.wait(61).apply(ExpireLease(story.attempt.id), draw=0.0)
    story.wait(60).lease().wait(61).apply(ExpireLease(story.attempt.id), draw=0.0)
    story.wait(60).lease().wait(1).apply(RevokeAttempt(story.attempt.id, "worker disabled"))


def _revoked_while_cancelling(story: Story) -> None:
    story.wait(1).run().apply(RequestCancel())
    story.wait(1).apply(RevokeAttempt(story.attempt.id, "worker disabled"))


@pytest.mark.parametrize("lifecycle", [_completed, _retried_then_failed, _timed_out, _cancelled_while_running,
                                       _cancel_terminated, _cancelled_in_retry_wait,
                                       _cancel_delivered_on_renew_then_acknowledged,
                                       _cancel_delivered_on_long_poll_then_terminated,
                                       _revoked_then_completed_elsewhere, _revoked_on_the_last_attempt,
                                       _revoked_while_cancelling])
def test_the_projected_task_and_attempts_match_the_domain_after_every_event(
        lifecycle: Callable[[Story], None]) -> None:
    story = Story.create(max_attempts=3, lease_seconds=60, execution_timeout_seconds=600,
                         required_capabilities=("udp", "tcp"), scope={"host": "h"}, parameters={"n": 1}).lease()
    lifecycle(story)
    assert story.task.terminal
    fold_both(story)


def test_a_completed_task_records_its_batches_and_the_job_success() -> None:
    story = Story.create().lease()
    _completed(story)
    tables = fold_both(story)
    batches = sorted(tables.tables["worker_result_batches"].values(), key=lambda r: r["sequence_number"])
    assert [(b["sequence_number"], b["final"], b["status"], b["task_id"], b["attempt_id"]) for b in batches] == [
        (1, False, "persisted", TASK_ID, story.attempt.id), (2, True, "persisted", TASK_ID, story.attempt.id)]
    assert batches[0]["idempotency_key"] == "k1" and batches[0]["record_count"] == 2
    assert batches[0]["accepted_at"] == START + timedelta(seconds=3)
    job = row(tables, "scan_jobs", JOB_ID)
    assert (job["status"], job["started_at"], job["finished_at"]) == ("success", START, story.now)


def test_the_first_lease_starts_the_job_and_the_scan_and_a_retry_does_not_restart_the_job() -> None:
    story = Story.create().lease()
    story.wait(61).apply(ExpireLease(story.attempt.id))
    story.wait(60).lease()
    tables = fold_both(story)
    job = row(tables, "scan_jobs", JOB_ID)
    assert (job["status"], job["started_at"], job["updated_at"], job["finished_at"]) == (
        "running", START, story.now, None)
    assert row(tables, "scans", SCAN_ID)["status"] == "running"


@pytest.mark.parametrize("status", ["success", "cancelled"])
def test_a_lease_never_moves_a_scan_that_is_past_pending(status: str) -> None:
    """The one task write to a scan row is guarded, so replay order cannot undo a finished scan."""
    tables = scan_with_job()
    finished = scan.finish_scan(SCAN_ID, 2, status, now=START, actor="test")  # type: ignore[arg-type]
    tables.apply(project(finished, HASH))
    story = Story.create().lease()
    for event in story.events:
        tables.apply(project(event, HASH))
    assert row(tables, "scans", SCAN_ID)["status"] == status


def test_a_refused_write_moves_the_head_but_not_updated_at() -> None:
    story = Story.create().lease().wait(5)
    story.apply(MarkRunning(story.attempt, token_hash(0)))
    tables = fold_both(story)
    task_row = row(tables, "worker_tasks", TASK_ID)
    assert task_row["updated_at"] == START and task_row["version"] == 3


def test_the_cancellation_row_keeps_request_delivery_channel_and_acknowledgement() -> None:
    story = Story.create().lease().wait(5)
    story.apply(RequestCancel())
    story.wait(2).apply(DeliverCancel(story.attempt.id, "long-poll"))
    story.wait(1).apply(Renew(story.attempt, story.token))  # a later delivery records nothing
    story.wait(3).apply(AcknowledgeCancel(story.attempt, story.token))
    task_row = row(fold_both(story), "worker_tasks", TASK_ID)
    assert (task_row["cancel_requested_at"], task_row["cancel_delivered_at"], task_row["cancel_delivery_channel"],
            task_row["cancel_acknowledged_at"]) == (START + timedelta(seconds=5), START + timedelta(seconds=7),
                                                    "long-poll", START + timedelta(seconds=11))


def test_a_terminated_cancellation_has_no_acknowledgement() -> None:
    story = Story.create().lease().wait(5)
    story.apply(RequestCancel())
    story.wait(31).apply(TerminateCancelling(timedelta(seconds=30)))
    task_row = row(fold_both(story), "worker_tasks", TASK_ID)
    assert (task_row["state"], task_row["cancel_delivered_at"], task_row["cancel_acknowledged_at"]) == (
        "cancelled", None, None)


def test_a_cancel_keeps_the_time_it_was_requested() -> None:
    story = Story.create().lease().wait(5)
    story.apply(RequestCancel())
    story.wait(5).apply(AcknowledgeCancel(story.attempt, story.token))
    tables = fold_both(story)
    assert row(tables, "worker_tasks", TASK_ID)["cancel_requested_at"] == START + timedelta(seconds=5)


# --- every event has a projection -------------------------------------------------------------


def _event_classes(base: type[ev.DomainEvent] = ev.DomainEvent) -> set[type[ev.DomainEvent]]:
    """The domain's own event classes (tests elsewhere in the run define throwaway subclasses)."""
    found = set()
    for cls in base.__subclasses__():
        if cls.__module__.startswith("leasehold.domain."):
            found |= {cls}
        found |= _event_classes(cls)
    return found


def test_every_domain_event_has_a_projection() -> None:
    fallback = project.dispatch(object)
    missing = sorted(cls.__name__ for cls in _event_classes() if project.dispatch(cls) is fallback)
    assert missing == []
    with pytest.raises(TypeError, match="no projection for DomainEvent"):
        project(ev.DomainEvent(originator_id=TASK_ID, originator_version=1, timestamp=START, actor="t"), HASH)


def test_every_projected_table_has_a_primary_key() -> None:
    """The memory tables and verification key rows by PRIMARY_KEYS; an op on another table is a bug."""
    story = Story.create().lease()
    _completed(story)
    tables: set[str] = set()
    for event in story.events:
        tables |= {op.table for op in project(event, HASH)}
    assert tables <= set(PRIMARY_KEYS)


# --- organisations and workers ------------------------------------------------------------------

WORKER_ID, ORG_B = UUID(int=99), UUID(int=5)


def test_an_organisation_starts_gateway_executed_and_its_flag_moves_the_head() -> None:
    tables = MemoryTables()
    created = registry.create_organization(ORG_ID, " acme ", now=START, actor="op")
    tables.apply(project(created, HASH))
    (flag,) = profiles.set_organization_gateway_execution(ORG_ID, 1, True, False, now=START + timedelta(seconds=1),
                                                          actor="op")
    tables.apply(project(flag, b"\x01" * 32))
    assert row(tables, "organizations", ORG_ID) == {
        "id": ORG_ID, "name": "acme", "created_at": START, "updated_at": START + timedelta(seconds=1),
        "version": 2, "head_hash": b"\x01" * 32, "gateway_execution": False, "target_policy": None,
        "fair_weight": 1, "max_live_attempts": None, "max_queued_tasks": None, "max_queued_scans": None}


def test_admission_caps_are_projected_on_the_organisation() -> None:
    tables = MemoryTables()
    tables.apply(project(registry.create_organization(ORG_ID, "acme", now=START, actor="op"), HASH))
    later = START + timedelta(seconds=3)
    (caps,) = admission.set_admission(ORG_ID, 1, (None, None), 10, 0, reason="flood", now=later, actor="op")
    tables.apply(project(caps, b"\x03" * 32))
    org = row(tables, "organizations", ORG_ID)
    assert (org["max_queued_tasks"], org["max_queued_scans"], org["version"], org["updated_at"]) == (10, 0, 2, later)


def test_a_target_policy_replaces_the_organisations_own() -> None:
    tables = MemoryTables()
    tables.apply(project(registry.create_organization(ORG_ID, "acme", now=START, actor="op"), HASH))
    later = START + timedelta(seconds=2)
    (policy,) = targets.set_target_policy(ORG_ID, 1, targets.parse_policy(["10.0.0.0/8"], ["bad.example"]),
                                          now=later, actor="op")
    tables.apply(project(policy, b"\x02" * 32))
    assert row(tables, "organizations", ORG_ID)["target_policy"] == {"allow": ["10.0.0.0/8"], "deny": ["bad.example"]}
    assert row(tables, "organizations", ORG_ID)["version"] == 2
    assert targets.policy_from_json(row(tables, "organizations", ORG_ID)["target_policy"]).allow == ["10.0.0.0/8"]




def test_an_organisations_fair_share_settings_move_its_head() -> None:
    tables = MemoryTables()
    tables.apply(project(registry.create_organization(ORG_ID, "acme", now=START, actor="op"), HASH))
    (share,) = fairness.set_fair_share(ORG_ID, 1, (1, None), 3, 7, now=START + timedelta(seconds=1), actor="op")
    tables.apply(project(share, b"\x02" * 32))
    projected = row(tables, "organizations", ORG_ID)
    assert (projected["fair_weight"], projected["max_live_attempts"], projected["version"],
            projected["head_hash"], projected["updated_at"]) == (3, 7, 2, b"\x02" * 32, START + timedelta(seconds=1))


def test_the_projected_worker_and_assignments_match_the_domain_after_every_event() -> None:
    tables = MemoryTables()
    now = START
    events: list[ev.DomainEvent] = [registry.register_worker(
        WORKER_ID, name="w", fingerprint="ab" * 32, capabilities=("tcp",), task_types=("probe",),
        max_concurrent_tasks=2, now=now, actor="op")]
    state = registry.project_worker(events)
    assert state is not None
    steps: list[Callable[[registry.WorkerState], list[ev.DomainEvent]]] = [
        lambda w: registry.assign(w, ORG_ID, now=now, actor="op"),
        lambda w: registry.assign(w, ORG_B, now=now, actor="op"),
        lambda w: registry.update_worker(w, capabilities=("udp", "tcp"), max_concurrent_tasks=4, now=now,
                                         actor="op"),
        lambda w: registry.end_assignment(w, ORG_ID, revoke=False, now=now, actor="op"),
        lambda w: registry.set_worker_enabled(w, False, now=now, actor="op"),
        lambda w: registry.set_worker_enabled(w, True, now=now, actor="op"),
        lambda w: registry.assign(w, ORG_ID, now=now, actor="op"),
        lambda w: registry.end_assignment(w, ORG_B, revoke=True, now=now, actor="op"),
        lambda w: registry.revoke_worker(w, reason="key leaked", now=now, actor="op"),
    ]
    tables.apply(project(events[0], hash_of(events[0])))
    for step in steps:
        now += timedelta(seconds=1)
        new = step(state)
        assert len(new) == 1
        state = registry.project_worker(new, state)
        assert state is not None
        tables.apply(project(new[0], hash_of(new[0])))
        worker_row = row(tables, "workers", WORKER_ID)
        assert {c: worker_row[c] for c in ("id", "name", "fingerprint", "enabled", "capabilities", "task_types",
                                           "max_concurrent_tasks", "version", "head_hash", "updated_at")} == {
            "id": state.id, "name": state.name, "fingerprint": state.fingerprint, "enabled": state.enabled,
            "capabilities": list(state.capabilities), "task_types": list(state.task_types),
            "max_concurrent_tasks": state.max_concurrent_tasks, "version": state.version,
            "head_hash": hash_of(new[0]), "updated_at": now}
        assert (worker_row["revoked_at"] is not None) == state.revoked
        projected = {org: (r["enabled"], r["revoked_at"] is not None)
                     for (org, _), r in tables.tables["organization_workers"].items()}
        assert projected == {org: (a.active, a.revoked) for org, a in state.assignments.items()}
    assert row(tables, "workers", WORKER_ID)["revoked_at"] == now
    assert row(tables, "organization_workers", ORG_B, WORKER_ID)["revoked_at"] == now - timedelta(seconds=1)
    reassigned = row(tables, "organization_workers", ORG_ID, WORKER_ID)
    assert reassigned["revoked_at"] is None and reassigned["updated_at"] == START + timedelta(seconds=7)


# --- scans ------------------------------------------------------------------------------------------


def test_a_new_scan_is_pending_with_no_origin() -> None:
    tables = scan_with_job()
    scan_row = row(tables, "scans", SCAN_ID)
    assert scan_row == {
        "id": SCAN_ID, "organization_id": ORG_ID, "status": "pending", "execution_mode": "gateway",
        "targets": {"targets": ["h"]}, "profile": None, "cancel_requested_at": None, "created_at": START,
        "updated_at": START, "finished_at": None, "version": 2, "head_hash": hash_of(ev.ScanJobQueued(
            originator_id=SCAN_ID, originator_version=2, timestamp=START, actor="t", job_id=JOB_ID,
            organization_id=ORG_ID, position=0, plugin="p", execution_mode="gateway")),
        "stored_profile_id": None, "legacy_scan_id": None, "legacy_message_sha256": None, "handed_over_to": None}
    assert row(tables, "scan_jobs", JOB_ID) == {
        "id": JOB_ID, "scan_id": SCAN_ID, "organization_id": ORG_ID, "position": 0, "plugin": "probe",
        "status": "queued", "execution_mode": "gateway", "created_at": START, "updated_at": START,
        "started_at": None, "finished_at": None}


def test_a_scan_profile_is_stored_whole_and_reads_back_as_the_same_steps() -> None:
    steps = (ev.ProfileStep(task_type="discover", required_capabilities=("tcp", "udp"), lease_seconds=300,
                            execution_timeout_seconds=900, max_attempts=2, priority=7, stop_on_failure=False),
             ev.ProfileStep(task_type="portscan"))
    tables = scan_with_job()
    event = scan.set_profile(SCAN_ID, 2, steps, now=START, actor="test")
    tables.apply(project(event, HASH))
    scan_row = row(tables, "scans", SCAN_ID)
    assert tuple(profile_steps(scan_row["profile"])) == steps
    assert scan_row["version"] == 3 and scan_row["head_hash"] == HASH


def test_a_scan_origin_is_recorded_on_the_scan() -> None:
    tables = scan_with_job()
    (event,) = scan.record_origin(SCAN_ID, 2, stored_profile_id=UUID(int=8), legacy_scan_id="L-1",
                                  legacy_message_sha256="ff" * 32, now=START, actor="test")
    tables.apply(project(event, HASH))
    scan_row = row(tables, "scans", SCAN_ID)
    assert (scan_row["stored_profile_id"], scan_row["legacy_scan_id"], scan_row["legacy_message_sha256"]) == (
        UUID(int=8), "L-1", "ff" * 32)


def test_legacy_progress_sets_the_status_and_an_outcome_finishes_the_scan() -> None:
    tables = scan_with_job()
    later = START + timedelta(seconds=9)
    (running_,) = scan.record_legacy_status(SCAN_ID, 2, "legacy", "pending", "running", now=START, actor="l")
    tables.apply(project(running_, HASH))
    assert (row(tables, "scans", SCAN_ID)["status"], row(tables, "scans", SCAN_ID)["finished_at"]) == (
        "running", None)
    (done,) = scan.record_legacy_status(SCAN_ID, 3, "legacy", "running", "failed", now=later, actor="l")
    tables.apply(project(done, HASH))
    assert (row(tables, "scans", SCAN_ID)["status"], row(tables, "scans", SCAN_ID)["finished_at"]) == (
        "failed", later)


def test_a_handed_over_legacy_scan_and_its_jobs_end_cancelled() -> None:
    tables = scan_with_job()
    later = START + timedelta(seconds=3)
    event = scan.hand_over(SCAN_ID, 2, "legacy", "pending", gateway_scan_id=UUID(int=77), job_ids=[JOB_ID],
                           now=later, actor="drain")
    tables.apply(project(event, HASH))
    scan_row, job = row(tables, "scans", SCAN_ID), row(tables, "scan_jobs", JOB_ID)
    assert (scan_row["status"], scan_row["finished_at"], scan_row["handed_over_to"]) == (
        "cancelled", later, UUID(int=77))
    assert (job["status"], job["finished_at"], job["updated_at"]) == ("cancelled", later, later)


def test_a_scan_cancel_request_and_finish_are_recorded() -> None:
    tables = scan_with_job()
    (cancel,) = scan.request_cancel(SCAN_ID, 2, "running", False, reason="r", now=START, actor="op")
    finished = scan.finish_scan(SCAN_ID, 3, "cancelled", now=START + timedelta(seconds=1), actor="op")
    tables.apply(project(cancel, HASH))
    tables.apply(project(finished, HASH))
    scan_row = row(tables, "scans", SCAN_ID)
    assert (scan_row["cancel_requested_at"], scan_row["status"], scan_row["finished_at"], scan_row["version"]) == (
        START, "cancelled", START + timedelta(seconds=1), 4)


# --- schedules and stored profiles --------------------------------------------------------------------

SCHEDULE_ID, PROFILE_ID = UUID(int=31), UUID(int=32)
STEPS = (ev.ProfileStep(task_type="probe"),)


def test_a_schedule_row_follows_its_stream() -> None:
    tables = MemoryTables()
    timing = schedule.Timing(None, 60, "UTC")
    created = schedule.create(SCHEDULE_ID, ORG_ID, name="every minute", timing=timing, targets={"t": 1},
                              profile=STEPS, misfire_policy="skip", now=START, actor="op")
    tables.apply(project(created, HASH))
    sched = row(tables, "scheduled_scans", SCHEDULE_ID)
    assert (sched["enabled"], sched["next_run_at"], sched["last_run_at"], sched["deleted_at"]) == (
        True, START + timedelta(seconds=60), None, None)
    assert sched["profile"] == {"steps": [{"task_type": "probe", "required_capabilities": [],
                                           "execution_timeout_seconds": 3600, "max_attempts": 3, "priority": 0,
                                           "stop_on_failure": True, "lease_seconds": 60}]}
    state = schedule.ScheduleState(SCHEDULE_ID, 1, ORG_ID, "every minute", timing, {"t": 1}, STEPS, True, "skip",
                                   START + timedelta(seconds=60), False)
    fired_at = START + timedelta(seconds=61)
    fired = schedule.on_due(state, scan_id=SCAN_ID, now=fired_at, actor="scheduler")
    assert isinstance(fired, ev.ScheduleFired)
    tables.apply(project(fired, HASH))
    assert (sched["next_run_at"], sched["last_run_at"], sched["version"]) == (
        START + timedelta(seconds=120), fired_at, 2)
    skipped = ev.ScheduleSkipped(originator_id=SCHEDULE_ID, originator_version=3, timestamp=fired_at, actor="s",
                                 slots=4, first_slot=START, next_run_at=START + timedelta(seconds=300))
    tables.apply(project(skipped, HASH))
    assert (sched["next_run_at"], sched["last_run_at"]) == (START + timedelta(seconds=300), fired_at)
    (paused,) = schedule.set_enabled(replace(state, version=3), False, now=fired_at, actor="op")
    tables.apply(project(paused, HASH))
    assert sched["enabled"] is False
    (deleted,) = schedule.delete(replace(state, version=4), now=fired_at, actor="op")
    tables.apply(project(deleted, HASH))
    assert (sched["enabled"], sched["deleted_at"], sched["version"]) == (False, fired_at, 5)


def test_a_stored_profile_row_follows_its_stream() -> None:
    tables = MemoryTables()
    stored = profiles.store(PROFILE_ID, None, name="default", steps=STEPS, now=START, actor="admin")
    tables.apply(project(stored, HASH))
    prof = row(tables, "stored_profiles", PROFILE_ID)
    assert (prof["organization_id"], prof["name"], prof["gateway_execution"], prof["deleted_at"]) == (
        None, "default", True, None)
    state = profiles.StoredProfileState(PROFILE_ID, 1, None, "default", STEPS, True)
    new_steps = (ev.ProfileStep(task_type="dns"),)
    (replaced,) = profiles.replace(state, new_steps, now=START, actor="admin")
    tables.apply(project(replaced, HASH))
    assert tuple(profile_steps(prof["profile"])) == new_steps
    (flag,) = profiles.set_gateway_execution(replace(state, version=2), False, now=START, actor="admin")
    tables.apply(project(flag, HASH))
    (deleted,) = profiles.delete(replace(state, version=3), now=START + timedelta(seconds=1), actor="admin")
    tables.apply(project(deleted, HASH))
    assert (prof["gateway_execution"], prof["deleted_at"], prof["version"]) == (
        False, START + timedelta(seconds=1), 4)


def test_row_changes_are_plain_values() -> None:
    """Projectors return Insert/Update values, never SQL: the same change serves live and replay."""
    (insert,) = project(registry.create_organization(ORG_ID, "acme", now=START, actor="op"), HASH)
    assert isinstance(insert, Insert) and insert.table == "organizations"
    (update,) = project(ev.WorkerEnabledChanged(originator_id=WORKER_ID, originator_version=2, timestamp=START,
                                                actor="op", enabled=False), HASH)
    assert update == Update("workers", {"id": WORKER_ID}, {"enabled": False, "version": 2, "head_hash": HASH,
                                                           "updated_at": START})
