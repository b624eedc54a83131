"""The admission rule (pure): a cap admits up to its value, a refusal is a 429 with a Retry-After,
setting the same caps records nothing, and bad caps or a missing reason are refused."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

import pytest

from leasehold.domain.admission import RETRY_AFTER_SECONDS, AdmissionRefused, admit, set_admission
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
