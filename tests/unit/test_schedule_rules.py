"""Scheduled scans (domain/schedule.py): slots of a cron expression in a timezone or of a fixed
interval, the misfire policies, and the schedule's commands."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest

from leasehold.domain import events as ev
from leasehold.domain import schedule
from leasehold.domain.errors import InvalidRequest
from leasehold.domain.limits import MAX_FIELD_DEPTH, TooDeep
from leasehold.domain.schedule import ScheduleState, Timing
from support.refusals import refused

NOW = datetime(2030, 1, 1, tzinfo=UTC)
SID, ORG, SCAN = UUID(int=1), UUID(int=2), UUID(int=3)
PROFILE = (ev.ProfileStep(task_type="probe"),)
MINUTE = Timing(None, 60, "UTC")
HOURLY_CRON = Timing("0 * * * *", None, "UTC")


def state(timing: Timing = MINUTE, **changes: Any) -> ScheduleState:
    base = ScheduleState(id=SID, version=4, organization_id=ORG, name="s", timing=timing, targets={},
                         profile=PROFILE, enabled=True, misfire_policy="run_once", next_run_at=NOW, deleted=False)
    return replace(base, **changes)


# --- timing ---------------------------------------------------------------------------------------


def test_cron_in_a_timezone_across_dst() -> None:
    timing = Timing("0 9 * * *", None, "Europe/Berlin")
    t = datetime(2030, 3, 29, 12, tzinfo=UTC)  # DST starts 2030-03-31 in the EU
    slots = []
    for _ in range(4):
        t = timing.next_after(t)
        slots.append(t)
    assert slots == [datetime(2030, 3, 30, 8, tzinfo=UTC), datetime(2030, 3, 31, 7, tzinfo=UTC),
                     datetime(2030, 4, 1, 7, tzinfo=UTC), datetime(2030, 4, 2, 7, tzinfo=UTC)]
    autumn = timing.next_after(datetime(2030, 10, 27, 0, tzinfo=UTC))  # DST ends 2030-10-27
    assert autumn == datetime(2030, 10, 27, 8, tzinfo=UTC)
    with pytest.raises(InvalidRequest):
        Timing("not cron", None, "UTC").validate()
    with pytest.raises(InvalidRequest):
        Timing("0 9 * * *", 60, "UTC").validate()
    with pytest.raises(InvalidRequest):
        Timing(None, 60, "Mars/Olympus").validate()


def test_the_next_cron_slot_is_strictly_after_and_in_utc() -> None:
    slot = Timing("0 * * * *", None, "Europe/Berlin").next_after(NOW)
    assert slot == NOW + timedelta(hours=1) and slot.tzinfo is UTC


def test_a_cron_expression_whose_last_year_has_passed_has_no_next_slot() -> None:
    """croniter accepts a year as a seventh field; once that year is over, there is no slot: a
    refusal, not croniter's own error (which an HTTP request would turn into a 500)."""
    bounded = Timing("0 0 1 1 * 0 2025", None, "UTC")
    bounded.validate()  # it did fire once: checked from a fixed start, never from today
    assert bounded.next_after(datetime(2024, 6, 1, tzinfo=UTC)) == datetime(2025, 1, 1, tzinfo=UTC)
    with refused(InvalidRequest, "the cron expression '0 0 1 1 * 0 2025' never fires after 2030-01-01T00:00:00+00:00"):
        bounded.next_after(NOW)
    with refused(InvalidRequest, "the cron expression '0 0 1 1 * 0 2025' never fires after 2030-01-01T00:00:00+00:00"):
        _create(timing=bounded)


def test_interval_slots_count_from_their_anchor() -> None:
    anchor = NOW
    assert MINUTE.next_after(NOW - timedelta(seconds=1), anchor=anchor) == anchor  # the anchor is still ahead
    assert MINUTE.next_after(NOW, anchor=anchor) == NOW + timedelta(seconds=60)  # strictly after
    assert MINUTE.next_after(NOW + timedelta(seconds=59), anchor=anchor) == NOW + timedelta(seconds=60)
    assert MINUTE.next_after(NOW + timedelta(seconds=150), anchor=anchor) == NOW + timedelta(seconds=180)
    assert MINUTE.next_after(NOW) == NOW + timedelta(seconds=60)  # no anchor: one period on


ONE_OF = "a schedule has exactly one of cron and interval_seconds"


@pytest.mark.parametrize(("timing", "message"), [
    (Timing(None, None, "UTC"), ONE_OF),
    (Timing("0 9 * * *", 60, "UTC"), ONE_OF),
    (Timing(None, 60, "Mars/Olympus"), "unknown timezone 'Mars/Olympus'"),
    (Timing(None, 60, "../etc"), "unknown timezone '../etc'"),
    (Timing("not cron", None, "UTC"), "invalid cron expression 'not cron'"),
    (Timing("0 0 31 2 *", None, "UTC"), "the cron expression '0 0 31 2 *' never fires"),
    (Timing(None, 0, "UTC"), "interval_seconds must be at least 1"),
])
def test_a_timing_that_cannot_run_is_refused(timing: Timing, message: str) -> None:
    with refused(InvalidRequest, message):
        timing.validate()


@pytest.mark.parametrize("timing", [Timing(None, 1, "UTC"), Timing("0 0 29 2 *", None, "Europe/Berlin"),
                                    HOURLY_CRON])
def test_a_timing_that_runs_is_accepted(timing: Timing) -> None:
    timing.validate()


# --- commands -----------------------------------------------------------------------------------------


def _create(**changes: Any) -> ev.ScheduleCreated:
    options: dict[str, Any] = {"name": " nightly ", "timing": MINUTE, "targets": {"t": 1}, "profile": PROFILE,
                               "misfire_policy": "skip", "now": NOW, "actor": "op", **changes}
    return schedule.create(SID, ORG, **options)


def test_create_records_the_schedule_with_its_first_slot() -> None:
    event = _create()
    assert (event.originator_id, event.originator_version, event.organization_id, event.name) == (
        SID, 1, ORG, "nightly")
    assert (event.cron, event.interval_seconds, event.timezone, event.misfire_policy) == (None, 60, "UTC", "skip")
    assert (event.targets, event.profile, event.next_run_at) == ({"t": 1}, PROFILE, NOW + timedelta(seconds=60))


def test_create_records_a_cron_schedule_that_runs_once_per_due_claim() -> None:
    event = _create(timing=HOURLY_CRON, misfire_policy="run_once", name="n")
    assert (event.cron, event.interval_seconds, event.misfire_policy, event.name) == (
        "0 * * * *", None, "run_once", "n")
    assert event.next_run_at == NOW + timedelta(hours=1)


NAME = "schedule name must be 1..200 characters"


@pytest.mark.parametrize(("changes", "message"), [
    ({"name": "   "}, NAME), ({"name": "n" * 201}, NAME),
    ({"misfire_policy": "catch_up"}, "misfire_policy is run_once or skip"),
    ({"profile": ()}, "a schedule needs a profile of at least one step"),
    ({"timing": Timing(None, 0, "UTC")}, "interval_seconds must be at least 1")])
def test_create_refuses_a_schedule_that_cannot_run(changes: dict[str, Any], message: str) -> None:
    with refused(InvalidRequest, message):
        _create(**changes)


def test_create_refuses_targets_nesting_deeper_than_the_field_limit() -> None:
    deep: dict[str, Any] = {}
    for _ in range(MAX_FIELD_DEPTH - 1):  # with the outer object: one level past the limit
        deep = {"a": deep}
    _create(targets={"x": deep["a"]})
    with refused(TooDeep, f"targets nests deeper than {MAX_FIELD_DEPTH} levels") as refusal:
        _create(targets={"x": deep})
    assert refusal.value.details == {"field": "targets", "max_depth": MAX_FIELD_DEPTH}


def test_a_name_of_two_hundred_characters_is_accepted() -> None:
    assert _create(name="n" * 200).name == "n" * 200


def test_pausing_keeps_the_next_slot_and_resuming_never_fires_missed_ones() -> None:
    later = NOW + timedelta(seconds=150)
    (paused,) = schedule.set_enabled(state(), False, now=later, actor="op")
    assert isinstance(paused, ev.ScheduleEnabledChanged)
    assert (paused.originator_version, paused.enabled, paused.next_run_at) == (5, False, NOW)
    assert schedule.set_enabled(state(), True, now=later, actor="op") == []
    (resumed,) = schedule.set_enabled(state(enabled=False), True, now=later, actor="op")
    assert isinstance(resumed, ev.ScheduleEnabledChanged)
    assert (resumed.enabled, resumed.next_run_at) == (True, NOW + timedelta(seconds=180))


def test_delete_is_the_next_event() -> None:
    (event,) = schedule.delete(state(), now=NOW, actor="op")
    assert isinstance(event, ev.ScheduleDeleted) and event.originator_version == 5


# --- when due ---------------------------------------------------------------------------------------------


def test_missed_slots_count_the_slots_up_to_now() -> None:
    assert schedule.missed_slots(state(), NOW - timedelta(seconds=1)) == 0
    assert schedule.missed_slots(state(), NOW) == 1
    assert schedule.missed_slots(state(), NOW + timedelta(seconds=59)) == 1
    assert schedule.missed_slots(state(), NOW + timedelta(seconds=60)) == 2
    cron = state(HOURLY_CRON)
    assert schedule.missed_slots(cron, NOW - timedelta(seconds=1)) == 0
    assert schedule.missed_slots(cron, NOW + timedelta(minutes=59)) == 1
    assert schedule.missed_slots(cron, NOW + timedelta(hours=1)) == 2
    assert schedule.missed_slots(cron, NOW + timedelta(hours=10, minutes=5)) == 11


def test_counting_missed_cron_slots_stops_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule, "MAX_COUNTED_SLOTS", 5)
    assert schedule.missed_slots(state(HOURLY_CRON), NOW + timedelta(hours=100)) == 5


def test_a_due_schedule_fires_one_scan_for_its_slot() -> None:
    later = NOW + timedelta(hours=10, minutes=5)
    event = schedule.on_due(state(), scan_id=SCAN, now=later, actor="scheduler")
    assert isinstance(event, ev.ScheduleFired)
    assert (event.originator_version, event.scan_id, event.slot, event.manual, event.actor) == (
        5, SCAN, NOW, False, "scheduler")
    assert event.next_run_at == NOW + timedelta(hours=10, minutes=6)  # the first slot after now


def test_skip_drops_two_or_more_missed_slots_without_a_scan() -> None:
    s = state(misfire_policy="skip")
    late = NOW + timedelta(seconds=60)  # two slots: NOW and NOW + 60 s
    event = schedule.on_due(s, scan_id=SCAN, now=late, actor="scheduler")
    assert isinstance(event, ev.ScheduleSkipped)
    assert (event.slots, event.first_slot, event.next_run_at, event.originator_version) == (
        2, NOW, NOW + timedelta(seconds=120), 5)


def test_a_schedule_is_due_at_its_slot() -> None:
    event = schedule.on_due(state(), scan_id=SCAN, now=NOW, actor="scheduler")
    assert isinstance(event, ev.ScheduleFired) and (event.slot, event.next_run_at) == (
        NOW, NOW + timedelta(seconds=60))


def test_skip_runs_like_run_once_when_less_than_a_period_late() -> None:
    event = schedule.on_due(state(misfire_policy="skip"), scan_id=SCAN, now=NOW + timedelta(seconds=59),
                            actor="scheduler")
    assert isinstance(event, ev.ScheduleFired) and event.slot == NOW


@pytest.mark.parametrize("changes", [{"enabled": False}, {"deleted": True}, {"next_run_at": NOW + timedelta(1)}])
def test_a_paused_deleted_or_early_schedule_does_nothing(changes: dict[str, Any]) -> None:
    assert schedule.on_due(state(**changes), scan_id=SCAN, now=NOW, actor="scheduler") is None


def test_run_now_fires_outside_the_schedule() -> None:
    later = NOW + timedelta(seconds=5)
    event = schedule.run_now(state(), scan_id=SCAN, now=later, actor="op")
    assert (event.slot, event.next_run_at, event.manual, event.originator_version, event.scan_id) == (
        later, NOW, True, 5, SCAN)


def test_a_due_slot_an_admission_cap_refused_is_recorded_as_skipped_in_the_firings_place() -> None:
    """The skip takes the firing's place in the stream (same id, version, time, actor), drops
    exactly its one slot, moves the schedule on as the firing would have, and says why."""
    fired = schedule.on_due(state(), scan_id=SCAN, now=NOW + timedelta(seconds=5), actor="scheduler")
    assert isinstance(fired, ev.ScheduleFired)
    skipped = schedule.refused(fired, "the organisation has 3 scans queued (not started), its admission cap is 3")
    assert skipped == ev.ScheduleSkipped(
        originator_id=fired.originator_id, originator_version=fired.originator_version,
        timestamp=fired.timestamp, actor="scheduler", slots=1, first_slot=fired.slot,
        next_run_at=fired.next_run_at, reason="the organisation has 3 scans queued (not started), its admission cap is 3")
    assert (skipped.originator_id, skipped.slots, skipped.first_slot, skipped.next_run_at) == (
        state().id, 1, fired.slot, fired.next_run_at)
