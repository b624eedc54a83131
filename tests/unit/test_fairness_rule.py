"""The fair-share rule of acquisition (domain/fairness.py), on a pure model of a shared worker:
random arrivals across organisations of random weights, leases, and attempt ends under caps.

The property: while an organisation has an eligible task, the others are granted at most
``max_wait_leases`` (derived from the weights) leases in a row before it gets one. And with
every organisation backlogged, the leases divide in proportion to the weights.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leasehold.domain import fairness
from leasehold.domain.errors import InvalidRequest
from leasehold.domain.events import (
    FairShareCandidate,
    FairShareGrant,
    OrganizationFairShareSet,
    TaskCancelled,
    TaskCompleted,
)
from support.refusals import refused

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@dataclass
class Org:
    weight: int
    cap: int | None = None
    virtual_time: float = 0.0
    queue: deque[datetime] = field(default_factory=deque)  # created_at of its queued tasks
    live: int = 0

    def eligible(self) -> bool:
        return bool(self.queue) and (self.cap is None or self.live < self.cap)


class Worker:
    """One worker shared by the organisations, choosing exactly as acquisition does."""

    def __init__(self, orgs: dict[UUID, Org], fair: bool = True) -> None:
        self.orgs, self.fair, self.clock = orgs, fair, 0
        self.streak = dict.fromkeys(orgs, 0)  # leases to others in a row while the org was eligible
        self.worst = dict.fromkeys(orgs, 0)
        self.served: list[UUID] = []

    def arrive(self, org: UUID, tasks: int) -> None:
        for _ in range(tasks):
            self.clock += 1
            self.orgs[org].queue.append(T0 + timedelta(seconds=self.clock))

    def lease(self) -> UUID | None:
        candidates = [fairness.Candidate(org_id, 0, o.queue[0], o.virtual_time, o.weight, o.live, o.cap)
                      for org_id, o in self.orgs.items() if o.queue]
        order = fairness.preference(candidates, fair=self.fair)
        if not order:
            return None
        choice = order[0]
        chosen = choice.candidate.organization_id
        for org_id, o in self.orgs.items():
            if org_id == chosen or not o.eligible():
                self.streak[org_id] = 0
            else:
                self.streak[org_id] += 1
                self.worst[org_id] = max(self.worst[org_id], self.streak[org_id])
        o = self.orgs[chosen]
        o.virtual_time = fairness.next_virtual_time(o.virtual_time, choice.floor, o.weight)
        o.queue.popleft()
        o.live += 1
        self.served.append(chosen)
        return chosen

    def end(self, org: UUID) -> None:
        o = self.orgs[org]
        o.live = max(o.live - 1, 0)  # an attempt ended: one more may be leased under the cap


ORG_IDS = [UUID(int=i + 1) for i in range(5)]

operations = st.lists(st.one_of(
    st.tuples(st.just("arrive"), st.integers(0, 4), st.integers(1, 40)),
    st.tuples(st.just("lease"), st.integers(1, 30), st.just(0)),
    st.tuples(st.just("end"), st.integers(0, 4), st.integers(1, 5)),
), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(weights=st.lists(st.integers(1, 5), min_size=2, max_size=5),
       caps=st.lists(st.one_of(st.none(), st.integers(1, 6)), min_size=5, max_size=5),
       ops=operations)
def test_no_organisation_with_eligible_work_waits_more_than_k_leases(
        weights: list[int], caps: list[int | None], ops: list[tuple[str, int, int]]) -> None:
    ids = ORG_IDS[:len(weights)]
    worker = Worker({org: Org(w, cap) for org, w, cap in zip(ids, weights, caps, strict=False)})
    for kind, a, b in ops:
        if kind == "arrive":
            worker.arrive(ids[a % len(ids)], b)
        elif kind == "lease":
            for _ in range(a):
                worker.lease()
        else:
            for _ in range(b):
                worker.end(ids[a % len(ids)])
    bound = {org: fairness.max_wait_leases(org, dict(zip(ids, weights, strict=True))) for org in ids}
    for org in ids:
        assert worker.worst[org] <= bound[org], (org, worker.worst, bound)


@settings(max_examples=60, deadline=None)
@given(weights=st.lists(st.integers(1, 6), min_size=2, max_size=4), rounds=st.integers(1, 4))
def test_backlogged_organisations_share_in_proportion_to_their_weights(weights: list[int], rounds: int) -> None:
    ids = ORG_IDS[:len(weights)]
    worker = Worker({org: Org(w) for org, w in zip(ids, weights, strict=True)})
    leases = rounds * sum(weights) * 3
    for org in ids:
        worker.arrive(org, leases)  # every organisation stays backlogged throughout
    for _ in range(leases):
        worker.lease()
    for org, w in zip(ids, weights, strict=True):
        share = worker.served.count(org)
        expected = leases * w / sum(weights)
        assert abs(share - expected) <= len(ids), (org, share, expected)


def test_an_organisation_back_from_idle_is_not_owed_its_idle_period() -> None:
    a, b = ORG_IDS[:2]
    worker = Worker({a: Org(1), b: Org(1)})
    worker.arrive(a, 100)
    for _ in range(50):
        assert worker.lease() == a  # alone: every lease, its virtual time runs to 50
    worker.arrive(b, 100)
    served = [worker.lease() for _ in range(20)]
    assert served[0] == b  # the least-served organisation goes first
    assert served.count(a) >= 9 and served.count(b) >= 9  # then they alternate: b does not get 50 in a row


def test_priority_comes_before_fairness() -> None:
    a, b = ORG_IDS[:2]
    candidates = [fairness.Candidate(a, 5, T0, 100.0, 1), fairness.Candidate(b, 0, T0, 0.0, 1)]
    assert fairness.preference(candidates)[0].candidate.organization_id == a
    candidates = [fairness.Candidate(a, 0, T0, 100.0, 1), fairness.Candidate(b, 0, T0 + timedelta(1), 0.0, 1)]
    assert [c.candidate.organization_id for c in fairness.preference(candidates)] == [b, a]
    assert [c.candidate.organization_id for c in fairness.preference(candidates, fair=False)] == [a, b]


def test_with_fairness_off_priority_still_comes_before_age() -> None:
    a, b, c = ORG_IDS[:3]
    candidates = [fairness.Candidate(a, 0, T0, 0.0, 1), fairness.Candidate(b, 5, T0 + timedelta(2), 9.0, 1),
                  fairness.Candidate(c, 2, T0 + timedelta(1), 0.0, 1)]
    assert [ch.candidate.organization_id for ch in fairness.preference(candidates, fair=False)] == [b, c, a]


def test_an_organisation_at_its_cap_is_not_eligible() -> None:
    a, b = ORG_IDS[:2]
    candidates = [fairness.Candidate(a, 0, T0, 0.0, 1, live=2, max_live_attempts=2),
                  fairness.Candidate(b, 0, T0, 9.0, 1, live=0, max_live_attempts=1)]
    assert [c.candidate.organization_id for c in fairness.preference(candidates)] == [b]
    assert fairness.preference([candidates[0]]) == []


def test_the_floor_is_one_quantum_behind_the_most_served() -> None:
    a, b = ORG_IDS[:2]
    order = fairness.preference([fairness.Candidate(a, 0, T0, 10.0, 1), fairness.Candidate(b, 0, T0, 0.0, 4)])
    assert [(c.candidate.organization_id, c.tag) for c in order] == [(b, 9.0), (a, 10.0)]
    assert order[0].floor == 9.0 and order[0].quantum == 0.25
    assert fairness.next_virtual_time(0.0, 9.0, 4) == 9.25


def test_max_wait_leases_from_the_weights() -> None:
    a, b, c = ORG_IDS[:3]
    assert fairness.max_wait_leases(a, {a: 1, b: 1, c: 1}) == 4
    assert fairness.max_wait_leases(a, {a: 1, b: 3}) == 4
    assert fairness.max_wait_leases(b, {a: 1, b: 3}) == 2


def test_setting_weights_and_caps() -> None:
    org = ORG_IDS[0]
    (event,) = fairness.set_fair_share(org, 4, (1, None), 3, 10, now=T0, actor="operator:k")
    assert isinstance(event, OrganizationFairShareSet)
    assert (event.originator_version, event.weight, event.max_live_attempts) == (5, 3, 10)
    assert fairness.set_fair_share(org, 4, (3, 10), 3, 10, now=T0, actor="operator:k") == []
    for weight, cap in ((0, None), (1001, None), (1, 0), (1, 1_000_001)):
        with pytest.raises(InvalidRequest):
            fairness.set_fair_share(org, 4, (1, None), weight, cap, now=T0, actor="operator:k")


def test_weights_and_caps_are_bounded_inclusively_with_a_message_naming_the_range() -> None:
    for weight in (1, fairness.MAX_WEIGHT):
        fairness.validate_weight(weight)
    for weight in (0, fairness.MAX_WEIGHT + 1):
        with refused(InvalidRequest, f"weight must be between 1 and {fairness.MAX_WEIGHT}"):
            fairness.validate_weight(weight)
    for cap in (None, 1, fairness.MAX_CAP):
        fairness.validate_cap(cap)
    for cap in (0, fairness.MAX_CAP + 1):
        with refused(InvalidRequest, f"max_live_attempts must be between 1 and {fairness.MAX_CAP}, or null (no cap)"):
            fairness.validate_cap(cap)


def test_the_grant_records_the_choice_and_every_eligible_organisation() -> None:
    a, b = ORG_IDS[:2]
    candidates = [fairness.Candidate(a, 3, T0, 10.0, 1), fairness.Candidate(b, 3, T0, 0.0, 4, live=2,
                                                                            max_live_attempts=5)]
    choice = fairness.preference(candidates)[0]
    grant = fairness.grant_record(choice, candidates, virtual_time=9.25, live=3, waited_seconds=1.5)
    assert grant == FairShareGrant(
        organization_id=b, tag=9.0, floor=9.0, virtual_time=9.25, weight=4, live=3, max_live_attempts=5,
        waited_seconds=1.5, eligible=(
            FairShareCandidate(organization_id=a, priority=3, virtual_time=10.0, weight=1, live=0,
                               max_live_attempts=None),
            FairShareCandidate(organization_id=b, priority=3, virtual_time=0.0, weight=4, live=2,
                               max_live_attempts=5)))


def test_which_events_end_a_live_attempt() -> None:
    head = {"originator_id": ORG_IDS[0], "originator_version": 2, "timestamp": T0, "actor": "t"}
    job, attempt = ORG_IDS[1], ORG_IDS[2]
    assert fairness.ends_attempt(TaskCancelled(**head, scan_job_id=job, attempt_id=attempt, reason="r"))
    assert not fairness.ends_attempt(TaskCancelled(**head, scan_job_id=job, attempt_id=None, reason="r"))
    assert fairness.ends_attempt(TaskCompleted(**head, scan_job_id=job, attempt_id=attempt))
    assert not fairness.ends_attempt(OrganizationFairShareSet(**head, weight=1, max_live_attempts=None))


def test_the_timeline_explains_a_fair_share_lease() -> None:
    from leasehold.domain.events import FairShareCandidate, FairShareGrant, TaskLeased
    from leasehold.replay.timeline import summarize

    a, b = ORG_IDS[:2]
    grant = FairShareGrant(organization_id=b, tag=9.0, floor=9.0, virtual_time=9.5, weight=2, live=3,
                           max_live_attempts=4, waited_seconds=1.25,
                           eligible=(FairShareCandidate(organization_id=a, priority=0, virtual_time=10.0, weight=1,
                                                        live=0),
                                     FairShareCandidate(organization_id=b, priority=0, virtual_time=0.0, weight=2,
                                                        live=2, max_live_attempts=4)))
    leased = TaskLeased(originator_id=UUID(int=9), originator_version=2, timestamp=T0, actor="worker:w",
                        scan_id=UUID(int=10), scan_job_id=UUID(int=11), attempt_id=UUID(int=12), worker_id=UUID(int=13),
                        attempt_number=1, lease_token_hash="ab" * 32, lease_expires_at=T0, deadline_at=T0,
                        fair_share=grant)
    line = summarize(leased, {})
    assert "fair share: tag 9 (floor 9, weight 2) among 2 eligible organisation(s)" in line
    assert "vt=10" in line and "virtual time now 9.5, live 3/4, waited 1.250s" in line


def test_each_choice_carries_the_next_tag_in_line_as_its_ceiling() -> None:
    a, b, c = ORG_IDS[:3]
    order = fairness.preference([fairness.Candidate(a, 0, T0, 0.0, 1), fairness.Candidate(b, 0, T0, 0.5, 1),
                                 fairness.Candidate(c, 9, T0, 0.9, 1)])
    assert [(ch.candidate.organization_id, ch.ceiling) for ch in order] == [
        (c, fairness.NO_CEILING), (a, 0.5), (b, fairness.NO_CEILING)]  # no ceiling across priorities
    assert all(ch.ceiling == fairness.NO_CEILING for ch in fairness.preference(
        [fairness.Candidate(a, 0, T0, 0.0, 1), fairness.Candidate(b, 0, T0, 0.5, 1)], fair=False))
