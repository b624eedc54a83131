"""Organisations, workers and assignments (domain/registry.py): the pure decisions on a worker's
stream, folded back by ``evolve_worker``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import pytest

from leasehold.domain import registry as rules
from leasehold.domain.errors import InvalidRequest, InvalidTransition, NotFound
from leasehold.domain.events import (
    AssignmentChanged,
    WorkerAssigned,
    WorkerRegistered,
    WorkerRevoked,
    WorkerUpdated,
)
from leasehold.domain.registry import WorkerState
from support.refusals import refused

NOW = datetime(2030, 1, 1, tzinfo=UTC)
ORG_A, ORG_B = UUID(int=1), UUID(int=2)


def registered() -> WorkerState:
    event = rules.register_worker(UUID(int=99), name="w", fingerprint="ab" * 32, capabilities=("b", "a", "a"),
                                  task_types=("probe",), max_concurrent_tasks=2, now=NOW, actor="test")
    worker = rules.project_worker([event])
    assert worker is not None
    return worker


def fold(worker: WorkerState, events: list[Any]) -> WorkerState:
    after = rules.project_worker(events, worker)
    assert after is not None
    return after


# --- pure decisions --------------------------------------------------------------------------


def test_registration_normalises_labels_and_fingerprint() -> None:
    event = rules.register_worker(uuid4(), name="w", fingerprint=":".join(["AB"] * 32), capabilities=("b", "a", "a"),
                                  task_types=(), max_concurrent_tasks=1, now=NOW, actor="test")
    assert isinstance(event, WorkerRegistered)
    assert event.fingerprint == "ab" * 32 and event.capabilities == ("a", "b")
    for bad in ({"max_concurrent_tasks": 0}, {"capabilities": (" padded",)}, {"capabilities": ("",)},
                {"fingerprint": "zz"}):
        kwargs: dict[str, Any] = {"name": "w", "fingerprint": "ab" * 32, "capabilities": (), "task_types": (),
                                  "max_concurrent_tasks": 1, **bad}
        with pytest.raises(InvalidRequest):
            rules.register_worker(uuid4(), now=NOW, actor="test", **kwargs)


def test_update_changes_only_what_is_given_and_repeating_it_is_a_no_op() -> None:
    worker = registered()
    events = rules.update_worker(worker, task_types=("probe", "dns"), now=NOW, actor="op")
    assert len(events) == 1 and isinstance(events[0], WorkerUpdated)
    assert events[0].originator_version == 2
    after = fold(worker, events)
    assert after.task_types == ("dns", "probe") and after.capabilities == ("a", "b")
    assert after.max_concurrent_tasks == 2
    assert rules.update_worker(after, task_types=("dns", "probe"), now=NOW, actor="op") == []
    assert rules.update_worker(after, now=NOW, actor="op") == []
    with pytest.raises(InvalidRequest):
        rules.update_worker(after, max_concurrent_tasks=1001, now=NOW, actor="op")


def test_enable_disable_are_idempotent() -> None:
    worker = registered()
    assert rules.set_worker_enabled(worker, True, now=NOW, actor="op") == []
    off = fold(worker, rules.set_worker_enabled(worker, False, now=NOW, actor="op"))
    assert not off.enabled
    assert rules.set_worker_enabled(off, False, now=NOW, actor="op") == []
    assert fold(off, rules.set_worker_enabled(off, True, now=NOW, actor="op")).enabled


def test_revocation_is_permanent_and_repeating_it_is_a_no_op() -> None:
    worker = fold(registered(), [])
    worker = fold(worker, rules.assign(worker, ORG_A, now=NOW, actor="op"))
    events = rules.revoke_worker(worker, reason="key leaked", now=NOW, actor="op")
    assert [type(e) for e in events] == [WorkerRevoked]
    revoked = fold(worker, events)
    assert revoked.revoked and not revoked.enabled
    assert rules.revoke_worker(revoked, reason="again", now=NOW, actor="op") == []
    assert rules.set_worker_enabled(revoked, False, now=NOW, actor="op") == []
    for change, what in ((lambda: rules.set_worker_enabled(revoked, True, now=NOW, actor="op"), "enabling it"),
                         (lambda: rules.update_worker(revoked, max_concurrent_tasks=3, now=NOW, actor="op"),
                          "changing it"),
                         (lambda: rules.assign(revoked, ORG_B, now=NOW, actor="op"), "assigning it")):
        with refused(InvalidTransition, f"the worker has been revoked; {what} is no longer possible"):
            change()
    with pytest.raises(InvalidRequest):
        rules.revoke_worker(worker, reason="  ", now=NOW, actor="op")


def test_assignment_lifecycle() -> None:
    worker = registered()
    with refused(NotFound, "the worker is not assigned to this organisation") as unassigned:
        rules.end_assignment(worker, ORG_A, revoke=False, now=NOW, actor="op")
    assert unassigned.value.details == {"worker_id": str(worker.id), "organization_id": str(ORG_A)}
    assigned = fold(worker, rules.assign(worker, ORG_A, now=NOW, actor="op"))
    assert assigned.assignments[ORG_A].active
    assert rules.assign(assigned, ORG_A, now=NOW, actor="op") == []  # already active

    removed_events = rules.end_assignment(assigned, ORG_A, revoke=False, now=NOW, actor="op")
    assert [(type(e), e.enabled, e.revoked) for e in removed_events if isinstance(e, AssignmentChanged)] == [
        (AssignmentChanged, False, False)]
    removed = fold(assigned, removed_events)
    assert not removed.assignments[ORG_A].active and not removed.assignments[ORG_A].revoked
    assert rules.end_assignment(removed, ORG_A, revoke=False, now=NOW, actor="op") == []

    revoked = fold(removed, rules.end_assignment(removed, ORG_A, revoke=True, now=NOW, actor="op"))
    assert revoked.assignments[ORG_A].revoked
    assert rules.end_assignment(revoked, ORG_A, revoke=True, now=NOW, actor="op") == []
    assert rules.end_assignment(revoked, ORG_A, revoke=False, now=NOW, actor="op") == []  # revoked is stronger

    again = rules.assign(revoked, ORG_A, now=NOW, actor="op")  # an explicit re-add is allowed
    assert [type(e) for e in again] == [WorkerAssigned]
    assert fold(revoked, again).assignments[ORG_A].active


def test_an_organisation_name_is_trimmed_and_has_one_to_two_hundred_characters() -> None:
    event = rules.create_organization(ORG_A, "  acme  ", now=NOW, actor="op")
    assert (event.originator_id, event.originator_version, event.name, event.actor) == (ORG_A, 1, "acme", "op")
    assert rules.create_organization(ORG_A, "n" * 200, now=NOW, actor="op").name == "n" * 200
    assert rules.create_organization(ORG_A, " n ", now=NOW, actor="op").name == "n"
    for bad in ("   ", "n" * 201):
        with refused(InvalidRequest, "organisation name must be 1..200 characters"):
            rules.create_organization(ORG_A, bad, now=NOW, actor="op")


def _register(**changes: Any) -> WorkerRegistered:
    options: dict[str, Any] = {"name": "w", "fingerprint": "ab" * 32, "capabilities": (), "task_types": (),
                               "max_concurrent_tasks": 1, **changes}
    return rules.register_worker(UUID(int=99), now=NOW, actor="op", **options)


def test_a_worker_is_registered_enabled_with_its_labels_and_capacity() -> None:
    event = _register(name="n" * 200, task_types=("probe", "dns", "probe"), max_concurrent_tasks=1000)
    assert (event.originator_version, event.name, event.task_types, event.max_concurrent_tasks) == (
        1, "n" * 200, ("dns", "probe"), 1000)
    worker = rules.project_worker([event])
    assert worker is not None
    assert (worker.enabled, worker.revoked, worker.task_types, worker.assignments) == (
        True, False, ("dns", "probe"), {})


NAME = "worker name must be 1..200 characters"
FINGERPRINT = "fingerprint must be the hex SHA-256 of the client certificate"
CAPACITY = "max_concurrent_tasks must be between 1 and 1000"


def label_rule(kind: str) -> str:
    return f"each of the {kind} must be 1..100 characters, without surrounding spaces"


@pytest.mark.parametrize(("changes", "message"), [
    ({"name": ""}, NAME), ({"name": "n" * 201}, NAME),
    ({"fingerprint": "ab" * 31}, FINGERPRINT), ({"fingerprint": "ab" * 32 + "00"}, FINGERPRINT),
    ({"fingerprint": "xy" * 32}, FINGERPRINT),
    ({"max_concurrent_tasks": 1001}, CAPACITY), ({"max_concurrent_tasks": 0}, CAPACITY),
    ({"task_types": tuple(f"t{i}" for i in range(rules.MAX_LABELS + 1))}, "at most 100 task types"),
    ({"capabilities": ("c" * (rules.MAX_LABEL_LENGTH + 1),)}, label_rule("capabilities")),
    ({"task_types": ("probe ",)}, label_rule("task types")),
])
def test_a_registration_out_of_bounds_is_refused(changes: dict[str, Any], message: str) -> None:
    with refused(InvalidRequest, message):
        _register(**changes)


def test_label_limits_are_inclusive() -> None:
    labels = tuple(f"t{i}" for i in range(rules.MAX_LABELS))
    event = _register(task_types=labels, capabilities=("c" * rules.MAX_LABEL_LENGTH,))
    assert len(event.task_types) == rules.MAX_LABELS and event.capabilities == ("c" * 100,)


def test_an_update_of_capabilities_or_capacity_alone_keeps_the_rest() -> None:
    worker = registered()
    (caps,) = rules.update_worker(worker, capabilities=("z", "y"), now=NOW, actor="op")
    assert isinstance(caps, WorkerUpdated)
    assert (caps.capabilities, caps.task_types, caps.max_concurrent_tasks) == (("y", "z"), ("probe",), 2)
    (capacity,) = rules.update_worker(worker, max_concurrent_tasks=1, now=NOW, actor="op")
    assert isinstance(capacity, WorkerUpdated)
    assert (capacity.capabilities, capacity.max_concurrent_tasks) == (("a", "b"), 1)
    with refused(InvalidRequest, label_rule("capabilities")):
        rules.update_worker(worker, capabilities=("",), now=NOW, actor="op")
    with refused(InvalidRequest, label_rule("task types")):
        rules.update_worker(worker, task_types=(" dns",), now=NOW, actor="op")


def test_events_of_one_decision_follow_the_workers_version() -> None:
    worker = fold(registered(), rules.assign(registered(), ORG_A, now=NOW, actor="op"))
    assert worker.version == 2
    (event,) = rules.set_worker_enabled(worker, False, now=NOW, actor="op")
    assert (event.originator_id, event.originator_version, event.timestamp, event.actor) == (
        worker.id, 3, NOW, "op")


def test_a_revocation_reason_is_trimmed_and_bounded() -> None:
    worker = registered()
    (event,) = rules.revoke_worker(worker, reason="  key leaked  ", now=NOW, actor="op")
    assert isinstance(event, WorkerRevoked) and event.reason == "key leaked"
    assert rules.revoke_worker(worker, reason="r" * 1000, now=NOW, actor="op")
    assert rules.revoke_worker(worker, reason="r", now=NOW, actor="op")
    with refused(InvalidRequest, "reason must be 1..1000 characters"):
        rules.revoke_worker(worker, reason="r" * 1001, now=NOW, actor="op")


def test_revoking_an_active_assignment_records_it_revoked_and_disabled() -> None:
    worker = fold(registered(), rules.assign(registered(), ORG_A, now=NOW, actor="op"))
    (event,) = rules.end_assignment(worker, ORG_A, revoke=True, now=NOW, actor="op")
    assert isinstance(event, AssignmentChanged)
    assert (event.organization_id, event.enabled, event.revoked) == (ORG_A, False, True)
    after = fold(worker, [event]).assignments[ORG_A]
    assert (after.enabled, after.revoked, after.active) == (False, True, False)


def test_a_re_enabled_assignment_of_a_revoked_one_stays_inactive() -> None:
    """``Assignment.active`` needs both: enabled and not revoked."""
    assert not rules.Assignment(ORG_A, enabled=True, revoked=True).active
    assert not rules.Assignment(ORG_A, enabled=False, revoked=False).active
    assert rules.Assignment(ORG_A, enabled=True, revoked=False).active
    changed = AssignmentChanged(originator_id=UUID(int=99), originator_version=3, timestamp=NOW, actor="op",
                                organization_id=ORG_A, enabled=True, revoked=True)
    worker = fold(registered(), rules.assign(registered(), ORG_A, now=NOW, actor="op"))
    assert fold(worker, [changed]).assignments[ORG_A] == rules.Assignment(ORG_A, False, True)


def test_the_bare_assignment_event_is_the_next_of_the_stream() -> None:
    event = rules.assign_worker(UUID(int=99), 4, ORG_B, now=NOW, actor="op")
    assert isinstance(event, WorkerAssigned)
    assert (event.originator_version, event.organization_id) == (5, ORG_B)


def test_evolve_worker_refuses_an_event_of_another_stream() -> None:
    event = rules.create_organization(ORG_A, "acme", now=NOW, actor="op")
    with refused(TypeError, "OrganizationCreated is not a worker event"):
        rules.evolve_worker(event, None)
