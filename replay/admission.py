"""Admission decisions from the log: every creation the caps govern, re-derived.

A refused creation leaves nothing in the log, so what the log can show is that every creation
it holds was admitted rightly: for each, the caps in force (the organisation's last
``OrganizationAdmissionSet`` before it) and what was queued just before it (tasks ``pending`` or
``retry_wait``, folded with :func:`domain.task.project_task`; Gateway-executed scans ``pending``:
created, neither finished nor started by a first lease of one of their tasks),
as the log says in its order. :func:`admission_violations` lists the creations admitted past a
cap; empty when the Gateway kept them.

Governed: a task created on an ad-hoc scan (``POST /v1/scans/{id}/tasks``; a profile scan's tasks
belong to the scan's own admission) and a Gateway-executed scan. Log order is commit order for
the governed creations of one organisation (they took turns); a task leaving or re-entering the
queue in a transaction that raced a creation may sit on either side of it, so on a busy log the
counts are those of a moment within the race, not always of the creation's own snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

from psycopg import AsyncConnection

from leasehold.domain import events as ev
from leasehold.domain.task import TaskState, project_task
from leasehold.persistence.codec import decode_event, topic_of
from leasehold.persistence.event_log import event_batches
from leasehold.persistence.snapshot import snapshot

_QUEUED = frozenset({"pending", "retry_wait"})
_ORGANIZATION_AND_SCAN = frozenset(topic_of(cls) for cls in (
    ev.OrganizationAdmissionSet, ev.ScanCreated, ev.ScanProfileSet, ev.ScanFinished))
_TASK_CREATED = topic_of(ev.TaskCreated)


@dataclass(frozen=True, slots=True)
class Decision:
    """A governed creation: what it was, whose, what was queued before it, and the cap then."""

    kind: Literal["task", "scan"]
    organization_id: UUID
    created_id: UUID
    queued_before: int
    cap: int | None

    @property
    def within_cap(self) -> bool:
        return self.cap is None or self.queued_before + 1 <= self.cap


async def admission_decisions(conn: AsyncConnection[Any]) -> list[Decision]:
    """Every governed creation in the log, in log order, read in one snapshot."""
    async with snapshot(conn):
        return await _decisions(conn)


async def _decisions(conn: AsyncConnection[Any]) -> list[Decision]:
    caps: dict[UUID, tuple[int | None, int | None]] = {}
    tasks: dict[UUID, TaskState] = {}
    queued: dict[UUID, int] = {}
    scans: dict[UUID, UUID] = {}  # Gateway-executed scan -> its organisation
    pending_scans: dict[UUID, set[UUID]] = {}
    profiled: set[UUID] = set()
    decisions: list[Decision] = []
    async for batch in event_batches(conn):
        for oid, version, topic, raw, _hash in batch:
            if topic in _ORGANIZATION_AND_SCAN:
                event = decode_event(oid, version, topic, raw)
                if isinstance(event, ev.OrganizationAdmissionSet):
                    caps[oid] = (event.max_queued_tasks, event.max_queued_scans)
                elif isinstance(event, ev.ScanCreated) and event.execution_mode == "gateway":
                    org = event.organization_id
                    pending = pending_scans.setdefault(org, set())
                    decisions.append(Decision("scan", org, oid, len(pending), caps.get(org, (None, None))[1]))
                    scans[oid] = org
                    pending.add(oid)
                elif isinstance(event, ev.ScanProfileSet):
                    profiled.add(oid)
                elif isinstance(event, ev.ScanFinished) and oid in scans:
                    pending_scans[scans[oid]].discard(oid)
                continue
            if topic == _TASK_CREATED:
                event = decode_event(oid, version, topic, raw)
                assert isinstance(event, ev.TaskCreated)
                org = event.organization_id
                if event.scan_id not in profiled:
                    decisions.append(Decision("task", org, oid, queued.get(org, 0), caps.get(org, (None, None))[0]))
            elif oid not in tasks:
                continue
            else:
                event = decode_event(oid, version, topic, raw)
                if isinstance(event, ev.TaskLeased) and event.scan_id in scans:  # its scan starts
                    pending_scans[scans[event.scan_id]].discard(event.scan_id)
            before = tasks.get(oid)
            after = project_task([event], before)
            assert after is not None
            tasks[oid] = after
            org = after.organization_id
            was, now = before is not None and before.state in _QUEUED, after.state in _QUEUED
            queued[org] = queued.get(org, 0) + (now - was)
    return decisions


async def admission_violations(conn: AsyncConnection[Any]) -> list[Decision]:
    """The governed creations the log shows admitted past a cap (empty: none), read in one snapshot."""
    return [d for d in await admission_decisions(conn) if not d.within_cap]
