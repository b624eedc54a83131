"""Organisations, workers and their assignments: who may lease what.

A worker is identified by the SHA-256 fingerprint of its client certificate; its
organisations, capabilities and capacity live here (in the database), never in a request.

Worker-stream commands follow the task core's shape: ``decide``-style functions take the
worker's current :class:`WorkerState` (read under the worker row's lock) and return the events
to append — an empty list when a repeated command is an idempotent no-op — or raise a
:mod:`domain.errors` error. :func:`evolve_worker` folds the stream back into the state.

Revocation (RFC "Cancellation", assignment revocation defaults): revoking a worker is
permanent; revoking or removing an assignment stops new leases of that organisation's tasks at
once. Whether the worker's active tasks are cancelled is the caller's policy (security
revocation: always; routine removal: unless the operator lets them finish), carried out as task
commands after the revocation has committed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import singledispatch
from types import MappingProxyType
from uuid import UUID

from leasehold.domain.errors import InvalidRequest, InvalidTransition, NotFound
from leasehold.domain.events import (
    AssignmentChanged,
    DomainEvent,
    OrganizationCreated,
    WorkerAssigned,
    WorkerEnabledChanged,
    WorkerRegistered,
    WorkerRevoked,
    WorkerUpdated,
)

FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")
MAX_LABELS = 100
MAX_LABEL_LENGTH = 100


def create_organization(org_id: UUID, name: str, *, now: datetime, actor: str) -> OrganizationCreated:
    name = name.strip()
    if not 1 <= len(name) <= 200:
        raise InvalidRequest("organisation name must be 1..200 characters")
    return OrganizationCreated(originator_id=org_id, originator_version=1, timestamp=now, actor=actor,
                               name=name)


def _labels(kind: str, values: Iterable[str]) -> tuple[str, ...]:
    """Capabilities or task types: a sorted set of short non-blank names."""
    labels = tuple(sorted(set(values)))
    if len(labels) > MAX_LABELS:
        raise InvalidRequest(f"at most {MAX_LABELS} {kind}")
    for label in labels:
        if not 1 <= len(label) <= MAX_LABEL_LENGTH or label != label.strip():
            raise InvalidRequest(f"each of the {kind} must be 1..{MAX_LABEL_LENGTH} characters, "
                                 "without surrounding spaces")
    return labels


def _capacity(max_concurrent_tasks: int) -> int:
    if not 1 <= max_concurrent_tasks <= 1000:
        raise InvalidRequest("max_concurrent_tasks must be between 1 and 1000")
    return max_concurrent_tasks


def register_worker(worker_id: UUID, *, name: str, fingerprint: str, capabilities: tuple[str, ...],
                    task_types: tuple[str, ...], max_concurrent_tasks: int, now: datetime,
                    actor: str) -> WorkerRegistered:
    fingerprint = fingerprint.lower().replace(":", "")
    if not FINGERPRINT.match(fingerprint):
        raise InvalidRequest("fingerprint must be the hex SHA-256 of the client certificate")
    if not 1 <= len(name) <= 200:
        raise InvalidRequest("worker name must be 1..200 characters")
    return WorkerRegistered(originator_id=worker_id, originator_version=1, timestamp=now, actor=actor,
                            name=name, fingerprint=fingerprint,
                            capabilities=_labels("capabilities", capabilities),
                            task_types=_labels("task types", task_types),
                            max_concurrent_tasks=_capacity(max_concurrent_tasks))


def assign_worker(worker_id: UUID, version: int, organization_id: UUID, *, now: datetime,
                  actor: str) -> WorkerAssigned:
    """The bare event (no checks); :func:`assign` is the command."""
    return WorkerAssigned(originator_id=worker_id, originator_version=version + 1, timestamp=now,
                          actor=actor, organization_id=organization_id)


# --- worker state ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Assignment:
    """A worker's standing with one organisation."""

    organization_id: UUID
    enabled: bool
    revoked: bool

    @property
    def active(self) -> bool:
        """Whether the worker may lease this organisation's tasks."""
        return self.enabled and not self.revoked


@dataclass(frozen=True, slots=True)
class WorkerState:
    """A worker as its stream (or, equivalently, its projection rows) says it is now."""

    id: UUID
    version: int
    name: str
    fingerprint: str
    enabled: bool
    revoked: bool
    capabilities: tuple[str, ...]
    task_types: tuple[str, ...]
    max_concurrent_tasks: int
    assignments: Mapping[UUID, Assignment] = field(default_factory=lambda: MappingProxyType({}))


class _Stream:
    """Numbers the events of one decision on a worker's stream."""

    def __init__(self, worker: WorkerState, now: datetime, actor: str) -> None:
        self.worker, self.now, self.actor, self.version = worker, now, actor, worker.version

    def event(self, cls: type[DomainEvent], **facts: object) -> DomainEvent:
        self.version += 1
        return cls(originator_id=self.worker.id, originator_version=self.version, timestamp=self.now,
                   actor=self.actor, **facts)


def _refuse_if_revoked(worker: WorkerState, what: str) -> None:
    if worker.revoked:
        raise InvalidTransition(f"the worker has been revoked; {what} is no longer possible")


def update_worker(worker: WorkerState, *, capabilities: Iterable[str] | None = None,
                  task_types: Iterable[str] | None = None, max_concurrent_tasks: int | None = None,
                  now: datetime, actor: str) -> list[DomainEvent]:
    """New capabilities, task types and/or capacity (``None``: unchanged). No change, no event."""
    _refuse_if_revoked(worker, "changing it")
    new_capabilities = worker.capabilities if capabilities is None else _labels("capabilities", capabilities)
    new_types = worker.task_types if task_types is None else _labels("task types", task_types)
    new_capacity = (worker.max_concurrent_tasks if max_concurrent_tasks is None
                    else _capacity(max_concurrent_tasks))
    if (new_capabilities, new_types, new_capacity) == (
            worker.capabilities, worker.task_types, worker.max_concurrent_tasks):
        return []
    return [_Stream(worker, now, actor).event(
        WorkerUpdated, capabilities=new_capabilities, task_types=new_types, max_concurrent_tasks=new_capacity)]


def set_worker_enabled(worker: WorkerState, enabled: bool, *, now: datetime, actor: str) -> list[DomainEvent]:
    """Enable or disable; repeating it is a no-op. A revoked worker stays off for good."""
    if worker.revoked:
        if not enabled:
            return []  # already off, permanently
        _refuse_if_revoked(worker, "enabling it")
    if worker.enabled == enabled:
        return []
    return [_Stream(worker, now, actor).event(WorkerEnabledChanged, enabled=enabled)]


def revoke_worker(worker: WorkerState, *, reason: str, now: datetime, actor: str) -> list[DomainEvent]:
    """Permanent. Repeating it is a no-op (the caller still finishes cancelling its tasks)."""
    reason = reason.strip()
    if not 1 <= len(reason) <= 1000:
        raise InvalidRequest("reason must be 1..1000 characters")
    if worker.revoked:
        return []
    return [_Stream(worker, now, actor).event(WorkerRevoked, reason=reason)]


def assign(worker: WorkerState, organization_id: UUID, *, now: datetime, actor: str) -> list[DomainEvent]:
    """Let the worker lease the organisation's tasks (again). Already active: no-op.

    Re-adding a removed or revoked assignment is an explicit operator decision, so it is allowed;
    a revoked worker can never be assigned again.
    """
    _refuse_if_revoked(worker, "assigning it")
    current = worker.assignments.get(organization_id)
    if current is not None and current.active:
        return []
    return [_Stream(worker, now, actor).event(WorkerAssigned, organization_id=organization_id)]


def end_assignment(worker: WorkerState, organization_id: UUID, *, revoke: bool, now: datetime,
                   actor: str) -> list[DomainEvent]:
    """Remove (routine) or revoke (security) an assignment: new leases stop at once.

    Repeating it is a no-op; removing a revoked assignment changes nothing (revoked is stronger),
    revoking a removed one records the revocation.
    """
    current = worker.assignments.get(organization_id)
    if current is None:
        raise NotFound("the worker is not assigned to this organisation",
                       worker_id=str(worker.id), organization_id=str(organization_id))
    if current.revoked or (not revoke and not current.enabled):
        return []
    return [_Stream(worker, now, actor).event(AssignmentChanged, organization_id=organization_id,
                                             enabled=False, revoked=revoke)]


# --- evolve ---------------------------------------------------------------------------------


@singledispatch
def evolve_worker(event: DomainEvent, worker: WorkerState | None) -> WorkerState:
    """Fold one worker-stream event into the worker's state."""
    raise TypeError(f"{type(event).__name__} is not a worker event")


def _with_assignment(worker: WorkerState, assignment: Assignment) -> MappingProxyType[UUID, Assignment]:
    return MappingProxyType({**worker.assignments, assignment.organization_id: assignment})


@evolve_worker.register
def _(e: WorkerRegistered, worker: WorkerState | None) -> WorkerState:
    return WorkerState(id=e.originator_id, version=e.originator_version, name=e.name, fingerprint=e.fingerprint,
                       enabled=True, revoked=False, capabilities=tuple(e.capabilities),
                       task_types=tuple(e.task_types), max_concurrent_tasks=e.max_concurrent_tasks)


@evolve_worker.register
def _(e: WorkerUpdated, worker: WorkerState | None) -> WorkerState:
    assert worker is not None
    return replace(worker, version=e.originator_version, capabilities=tuple(e.capabilities),
                   task_types=tuple(e.task_types), max_concurrent_tasks=e.max_concurrent_tasks)


@evolve_worker.register
def _(e: WorkerEnabledChanged, worker: WorkerState | None) -> WorkerState:
    assert worker is not None
    return replace(worker, version=e.originator_version, enabled=e.enabled)


@evolve_worker.register
def _(e: WorkerRevoked, worker: WorkerState | None) -> WorkerState:
    assert worker is not None
    return replace(worker, version=e.originator_version, enabled=False, revoked=True)


@evolve_worker.register
def _(e: WorkerAssigned, worker: WorkerState | None) -> WorkerState:
    assert worker is not None
    return replace(worker, version=e.originator_version,
                   assignments=_with_assignment(worker, Assignment(e.organization_id, True, False)))


@evolve_worker.register
def _(e: AssignmentChanged, worker: WorkerState | None) -> WorkerState:
    assert worker is not None
    assignment = Assignment(e.organization_id, e.enabled and not e.revoked, e.revoked)
    return replace(worker, version=e.originator_version, assignments=_with_assignment(worker, assignment))


def project_worker(events: Iterable[DomainEvent], worker: WorkerState | None = None) -> WorkerState | None:
    """Fold a worker's events (from ``worker``, or from nothing) into its state."""
    for event in events:
        worker = evolve_worker(event, worker)
    return worker
