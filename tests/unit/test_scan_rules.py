"""Scans and scan jobs (domain/scan.py): the statuses task events imply, a scan's outcome, its
commands, the profile rules and step sequencing, and scope enrichment."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pytest

from leasehold.domain import events as ev
from leasehold.domain import scan
from leasehold.domain.errors import InvalidRequest, InvalidTransition
from leasehold.domain.limits import MAX_FIELD_DEPTH, TooDeep
from support.refusals import refused

NOW = datetime(2030, 1, 1, tzinfo=UTC)
SCAN, ORG, JOB, ATTEMPT = UUID(int=1), UUID(int=2), UUID(int=3), UUID(int=4)
HEAD: dict[str, Any] = {"originator_id": UUID(int=9), "originator_version": 2, "timestamp": NOW, "actor": "t"}


def _failed(outcome: str, job_status: str | None) -> ev.AttemptFailed:
    return ev.AttemptFailed(**HEAD, scan_job_id=JOB, attempt_id=ATTEMPT, error="e", retryable=True,
                            reason="worker", outcome=outcome, available_at=None,  # type: ignore[arg-type]
                            job_status=job_status)  # type: ignore[arg-type]


def _expired(outcome: str) -> ev.LeaseExpired:
    return ev.LeaseExpired(**HEAD, scan_job_id=JOB, attempt_id=ATTEMPT, outcome=outcome,  # type: ignore[arg-type]
                           available_at=None)


@pytest.mark.parametrize(("event", "status"), [
    (ev.TaskLeased(**HEAD, scan_id=SCAN, scan_job_id=JOB, attempt_id=ATTEMPT, worker_id=ORG, attempt_number=1,
                   lease_token_hash="00", lease_expires_at=NOW, deadline_at=NOW), "running"),
    (ev.TaskCompleted(**HEAD, scan_job_id=JOB, attempt_id=ATTEMPT), "success"),
    (_failed("failed_terminal", "timeout"), "timeout"),
    (_failed("failed_terminal", None), "failed"),
    (_failed("retry_wait", None), None),
    (_expired("failed_terminal"), "failed"),
    (_expired("retry_wait"), None),
    (ev.TaskCancelled(**HEAD, scan_job_id=JOB, attempt_id=None, reason="r"), "cancelled"),
    (ev.TaskStarted(**HEAD, attempt_id=ATTEMPT), None),
    (ev.CancelRequested(**HEAD, reason="r"), None),
])
def test_the_job_status_each_task_event_implies(event: ev.DomainEvent, status: str | None) -> None:
    assert scan.job_status_after(event) == status


@pytest.mark.parametrize(("statuses", "cancel_requested", "outcome"), [
    ([], False, None),
    (["success", "running"], False, None),
    (["queued"], False, None),
    (["success", "success"], False, "success"),
    (["success", "failed"], False, "failed"),
    (["success", "timeout"], False, "failed"),
    (["cancelled", "cancelled"], False, "cancelled"),
    (["success", "cancelled"], False, "failed"),
    (["success"], True, "cancelled"),
    (["failed"], True, "cancelled"),
    (["success", "running"], True, None),
])
def test_a_scan_ends_once_every_job_has_ended(statuses: list[str], cancel_requested: bool,
                                              outcome: str | None) -> None:
    assert scan.scan_outcome(iter(statuses), cancel_requested=cancel_requested) == outcome


def test_a_scan_is_not_cancelled_unless_told_so() -> None:
    assert scan.scan_outcome(["success"]) == "success"


def test_create_scan_starts_the_scans_stream() -> None:
    event = scan.create_scan(SCAN, ORG, {"targets": ["h"]}, "legacy", now=NOW, actor="op")
    assert (event.originator_id, event.originator_version, event.timestamp, event.actor) == (SCAN, 1, NOW, "op")
    assert (event.organization_id, event.targets, event.execution_mode) == (ORG, {"targets": ["h"]}, "legacy")


def test_create_scan_refuses_targets_nesting_deeper_than_the_field_limit() -> None:
    deep: dict[str, Any] = {}
    for _ in range(MAX_FIELD_DEPTH - 1):  # with the outer object: one level past the limit
        deep = {"a": deep}
    scan.create_scan(SCAN, ORG, {"targets": ["h"], "x": deep["a"]}, "gateway", now=NOW, actor="op")
    with refused(TooDeep, f"targets nests deeper than {MAX_FIELD_DEPTH} levels") as refusal:
        scan.create_scan(SCAN, ORG, {"targets": ["h"], "x": deep}, "gateway", now=NOW, actor="op")
    assert refusal.value.details == {"field": "targets", "max_depth": MAX_FIELD_DEPTH}


def test_queue_job_adds_the_next_event_of_a_scan_that_has_not_ended() -> None:
    event = scan.queue_job(SCAN, 4, "running", organization_id=ORG, job_id=JOB, position=2, plugin="probe",
                           execution_mode="gateway", now=NOW, actor="op")
    assert (event.originator_version, event.job_id, event.position, event.plugin, event.organization_id) == (
        5, JOB, 2, "probe", ORG)
    for status in ("success", "failed", "cancelled"):
        with refused(InvalidTransition, f"the scan is already {status}"):
            scan.queue_job(SCAN, 4, status, organization_id=ORG, job_id=JOB, position=2,  # type: ignore[arg-type]
                           plugin="probe", execution_mode="gateway", now=NOW, actor="op")
    with refused(InvalidRequest, "plugin must not be empty"):
        scan.queue_job(SCAN, 4, "pending", organization_id=ORG, job_id=JOB, position=0, plugin="",
                       execution_mode="gateway", now=NOW, actor="op")


def test_finish_scan_records_the_outcome_as_the_next_event() -> None:
    event = scan.finish_scan(SCAN, 7, "failed", now=NOW, actor="system")
    assert (event.originator_version, event.status, event.actor) == (8, "failed", "system")


# --- profiles --------------------------------------------------------------------------------------


def step(**changes: Any) -> ev.ProfileStep:
    return ev.ProfileStep(**{"task_type": "probe", **changes})


def test_a_profile_has_one_to_fifty_steps() -> None:
    scan.validate_steps([step()])
    scan.validate_steps([step()] * scan.MAX_PROFILE_STEPS)
    for steps in ([], [step()] * (scan.MAX_PROFILE_STEPS + 1)):
        with refused(InvalidRequest, "a profile has 1..50 steps"):
            scan.validate_steps(steps)


LIMITS = "max_attempts and execution_timeout_seconds must be positive, lease_seconds 1..3600"


@pytest.mark.parametrize(("changes", "message"), [
    ({"task_type": ""}, "task_type must not be empty"), ({"max_attempts": 0}, LIMITS),
    ({"execution_timeout_seconds": 0}, LIMITS), ({"lease_seconds": 0}, LIMITS), ({"lease_seconds": 3601}, LIMITS)])
def test_each_step_is_checked(changes: dict[str, Any], message: str) -> None:
    with refused(InvalidRequest, message):
        scan.validate_steps([step(), step(**changes)])


def test_the_step_limits_are_inclusive() -> None:
    scan.validate_steps([step(max_attempts=1, execution_timeout_seconds=1, lease_seconds=1),
                         step(lease_seconds=3600)])


def test_set_profile_validates_and_records_the_steps() -> None:
    event = scan.set_profile(SCAN, 1, [step(), step(task_type="dns")], now=NOW, actor="op")
    assert event.originator_version == 2 and [s.task_type for s in event.steps] == ["probe", "dns"]
    with pytest.raises(InvalidRequest):
        scan.set_profile(SCAN, 1, [], now=NOW, actor="op")


def test_an_origin_is_recorded_only_when_there_is_one() -> None:
    assert scan.record_origin(SCAN, 2, stored_profile_id=None, legacy_scan_id=None, legacy_message_sha256=None,
                              now=NOW, actor="op") == []
    (event,) = scan.record_origin(SCAN, 2, stored_profile_id=UUID(int=7), legacy_scan_id=None,
                                  legacy_message_sha256=None, now=NOW, actor="op")
    assert (event.originator_version, event.stored_profile_id, event.legacy_scan_id) == (3, UUID(int=7), None)
    (legacy,) = scan.record_origin(SCAN, 2, stored_profile_id=None, legacy_scan_id="L" * 200,
                                   legacy_message_sha256="ab", now=NOW, actor="op")
    assert (legacy.legacy_scan_id, legacy.legacy_message_sha256) == ("L" * 200, "ab")
    assert scan.record_origin(SCAN, 2, stored_profile_id=None, legacy_scan_id="L", legacy_message_sha256=None,
                              now=NOW, actor="op")


@pytest.mark.parametrize("legacy_id", ["", "L" * 201])
def test_a_legacy_scan_id_has_one_to_two_hundred_characters(legacy_id: str) -> None:
    with refused(InvalidRequest, "a legacy scan id has 1..200 characters"):
        scan.record_origin(SCAN, 2, stored_profile_id=None, legacy_scan_id=legacy_id, legacy_message_sha256=None,
                           now=NOW, actor="op")


# --- the legacy side ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "new"), [("pending", "running"), ("pending", "success"),
                                             ("running", "failed"), ("running", "cancelled")])
def test_legacy_progress_moves_forward(status: str, new: str) -> None:
    (event,) = scan.record_legacy_status(SCAN, 3, "legacy", status, new, now=NOW, actor="legacy")  # type: ignore[arg-type]
    assert (event.originator_version, event.status) == (4, new)


def test_repeating_the_legacy_status_is_a_no_op() -> None:
    assert scan.record_legacy_status(SCAN, 3, "legacy", "running", "running", now=NOW, actor="l") == []
    assert scan.record_legacy_status(SCAN, 3, "legacy", "success", "success", now=NOW, actor="l") == []


@pytest.mark.parametrize(("mode", "status", "new", "message"), [
    ("gateway", "pending", "running", "only a legacy-executed scan takes progress reports from the legacy side"),
    ("legacy", "success", "failed", "the scan is already success"),
    ("legacy", "cancelled", "running", "the scan is already cancelled"),
    ("legacy", "running", "pending", "the scan is already running"),
])
def test_legacy_progress_never_goes_back_nor_reaches_a_gateway_scan(mode: str, status: str, new: str,
                                                                    message: str) -> None:
    with refused(InvalidTransition, message):
        scan.record_legacy_status(SCAN, 3, mode, status, new, now=NOW, actor="l")  # type: ignore[arg-type]


def test_a_pending_legacy_scan_is_handed_over_with_its_jobs() -> None:
    event = scan.hand_over(SCAN, 3, "legacy", "pending", gateway_scan_id=UUID(int=8), job_ids=[JOB, ATTEMPT],
                           now=NOW, actor="drain")
    assert (event.originator_version, event.gateway_scan_id, event.job_ids) == (4, UUID(int=8), (JOB, ATTEMPT))
    with refused(InvalidTransition, "only a legacy-executed scan can be handed over to the Gateway"):
        scan.hand_over(SCAN, 3, "gateway", "pending", gateway_scan_id=UUID(int=8), job_ids=[], now=NOW, actor="d")
    with refused(InvalidTransition, "the legacy scan is already running"):
        scan.hand_over(SCAN, 3, "legacy", "running", gateway_scan_id=UUID(int=8), job_ids=[], now=NOW, actor="d")


def test_a_scan_cancel_is_requested_once_and_never_after_the_end() -> None:
    (event,) = scan.request_cancel(SCAN, 3, "running", False, reason="operator", now=NOW, actor="op")
    assert (event.originator_version, event.reason) == (4, "operator")
    assert scan.request_cancel(SCAN, 3, "running", True, reason="again", now=NOW, actor="op") == []
    for status in ("success", "failed", "cancelled"):
        assert scan.request_cancel(SCAN, 3, status, False, reason="late", now=NOW, actor="op") == []
    assert scan.request_cancel(SCAN, 3, "pending", False, reason="early", now=NOW, actor="op")


# --- step sequencing -------------------------------------------------------------------------------------

STEPS = (step(task_type="a"), step(task_type="b", stop_on_failure=False), step(task_type="c"))


@pytest.mark.parametrize(("jobs", "last", "cancel", "expected"), [
    (1, "success", False, 1),
    (2, "success", False, 2),
    (3, "success", False, None),  # every step ran
    (0, None, False, None),  # the first step is queued when the scan opens
    (1, "running", False, None),
    (1, "failed", False, None),  # step a stops the profile on failure
    (2, "failed", False, 2),  # step b does not
    (2, "timeout", False, 2),
    (2, "cancelled", False, None),
    (1, "success", True, None),
])
def test_the_next_step_starts_after_the_last_one_ended_well_enough(jobs: int, last: str | None, cancel: bool,
                                                                   expected: int | None) -> None:
    assert scan.next_step(STEPS, jobs, last, cancel_requested=cancel) == expected


def test_enriched_scope_adds_found_assets_once_each() -> None:
    scope = {"targets": ["10.0.0.1"], "assets": [{"kind": "host", "value": "a"}, "not an asset"]}
    enriched = scan.enrich_scope(scope, [("host", "a"), ("host", "b"), ("port", "a"), ("host", "b")])
    assert enriched == ({"targets": ["10.0.0.1"], "assets": [
        {"kind": "host", "value": "a"}, {"kind": "host", "value": "b"}, {"kind": "port", "value": "a"}]}, 0)
    assert scope["assets"] == [{"kind": "host", "value": "a"}, "not an asset"]  # the input is left alone
    assert scan.enrich_scope({}, []) == ({"assets": []}, 0)


def test_enriched_scope_keeps_every_asset_found_past_ten_thousand() -> None:
    """A scope used to stop at 10,000 assets without a word: the rest never reached the next step."""
    scope, omitted = scan.enrich_scope({"targets": ["10.0.0.0/8"]}, [("host", str(i)) for i in range(100_000)])
    assert len(scope["assets"]) == 100_000 and omitted == 0
    assert scope["assets"][-1] == {"kind": "host", "value": "99999"}


def test_enriched_scope_past_its_limit_says_how_many_it_left_out() -> None:
    scope, omitted = scan.enrich_scope({"assets": [{"kind": "host", "value": "0"}]},
                                       [("host", str(i)) for i in range(5)] + [("host", "1"), ("host", "4")],
                                       max_assets=3)
    assert [a["value"] for a in scope["assets"]] == ["0", "1", "2"]
    assert omitted == 2  # "3" and "4", each once however often it was found
    assert scan.MAX_SCOPE_ASSETS >= 1_000_000


def test_enriched_scope_reads_missing_fields_as_empty() -> None:
    enriched, _ = scan.enrich_scope({"assets": [{"kind": "host"}, {}]}, [])
    assert enriched["assets"] == [{"kind": "host", "value": ""}, {"kind": "", "value": ""}]
