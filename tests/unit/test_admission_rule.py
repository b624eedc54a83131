"""The admission rule (pure): a cap admits up to its value, a refusal is a 429 with a Retry-After,
setting the same caps records nothing, and bad caps or a missing reason are refused."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

import pytest

from leasehold.domain.admission import (
    MAX_CAP,
    MAX_REASON,
    RETRY_AFTER_SECONDS,
    AdmissionRefused,
    admit,
    set_admission,
)
from leasehold.domain.errors import InvalidRequest

ORG, NOW = UUID(int=1), datetime(2026, 1, 1, tzinfo=UTC)


def test_a_cap_admits_up_to_its_value() -> None:
    admit("task", ORG, 10**9, None)  # no cap: anything
    admit("task", ORG, 4, 5)
    for queued, cap in ((5, 5), (6, 5), (0, 0)):
        with pytest.raises(AdmissionRefused) as refused:
            admit("scan", ORG, queued, cap)
        assert refused.value.status == 429 and refused.value.code == "admission-refused"
        assert refused.value.details == {"organization_id": str(ORG), "kind": "scan", "queued": queued, "cap": cap,
                                         "retry_after": RETRY_AFTER_SECONDS}


def test_setting_the_caps() -> None:
    (event,) = set_admission(ORG, 3, (None, None), 5, None, reason="  flood  ", now=NOW, actor="admin")
    assert (event.originator_version, event.max_queued_tasks, event.max_queued_scans, event.reason, event.actor) == (
        4, 5, None, "flood", "admin")
    assert set_admission(ORG, 4, (5, None), 5, None, reason="again", now=NOW, actor="admin") == []
    for tasks, scans, reason in ((-1, None, "r"), (None, 1_000_001, "r"), (1, 1, " "), (1, 1, "x" * 501)):
        with pytest.raises(InvalidRequest):
            set_admission(ORG, 4, (None, None), tasks, scans, reason=reason, now=NOW, actor="admin")


def test_a_refusal_says_what_is_queued_and_the_cap() -> None:
    with pytest.raises(AdmissionRefused) as task:
        admit("task", ORG, 7, 7)
    assert str(task.value) == "the organisation has 7 tasks queued, its admission cap is 7; retry later"
    with pytest.raises(AdmissionRefused) as scan:
        admit("scan", ORG, 2, 1)
    assert str(scan.value) == "the organisation has 2 scans queued (not started), its admission cap is 1; retry later"


def test_the_caps_bounds_and_the_reasons_length_are_inclusive() -> None:
    (event,) = set_admission(ORG, 0, (None, None), MAX_CAP, 0, reason="x" * MAX_REASON, now=NOW, actor="admin")
    assert (event.max_queued_tasks, event.max_queued_scans, len(event.reason)) == (MAX_CAP, 0, MAX_REASON)
    assert event.timestamp == NOW and event.originator_id == ORG


@pytest.mark.parametrize(("tasks", "scans", "reason", "message"), [
    (MAX_CAP + 1, None, "r", f"max_queued_tasks must be between 0 and {MAX_CAP}, or null (no cap)"),
    (None, -1, "r", f"max_queued_scans must be between 0 and {MAX_CAP}, or null (no cap)"),
    (1, 1, "", f"a reason is required (at most {MAX_REASON} characters)"),
])
def test_each_refused_setting_names_what_is_wrong(tasks: int | None, scans: int | None, reason: str,
                                                   message: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        set_admission(ORG, 4, (None, None), tasks, scans, reason=reason, now=NOW, actor="admin")
    assert str(refused.value) == message
