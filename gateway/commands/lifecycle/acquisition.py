"""The task lifecycle: acquire and the long-poll's poll: choosing a task fairly and leasing it."""

from __future__ import annotations

import secrets
from dataclasses import replace
from typing import Any
from uuid import UUID

from leasehold.domain import fairness
from leasehold.domain.errors import NotFound
from leasehold.domain.events import DomainEvent
from leasehold.domain.task import (
    GrantLease,
    ReissueLease,
    WorkerView,
    decide,
    project_task,
)
from leasehold.gateway.commands.lifecycle.base import (
    _MAX_TRIES,
    _TRIES_WITH_CEILINGS,
    NO_TASK_TYPES,
    Acquired,
    LifecycleBase,
    Poll,
    _Refused,
    hash_token,
)
from leasehold.persistence.rows import TaskGrantRow
from leasehold.persistence.task_rows import (
    caller_standing,
    task_from_row,
)
from leasehold.persistence.transaction import Read, Transaction, one, rows


class Acquisition(LifecycleBase):
    """Acquire and the long-poll's poll: choosing a task fairly and leasing it (part of :class:`Lifecycle`)."""

    async def acquire(self, worker_id: UUID, *, request_id: str | None = None,
                      actor: str | None = None, fingerprint: str | None = None) -> Acquired | None:
        """Lease one eligible task to the worker, or None (at capacity, or nothing eligible).

        With a ``request_id``, repeating the call returns the same attempt (with a fresh token,
        since only the token's hash is kept) instead of leasing a second task.
        """
        return (await self.poll(worker_id, request_id=request_id, actor=actor, notices=False,
                                fingerprint=fingerprint)).acquired

    async def creation_traceparent(self, task_id: UUID) -> str | None:
        """The trace context the task's creation recorded (``TaskCreated.traceparent``; None:
        created untraced): a traced Gateway hands it to the worker with the lease, so the
        worker's run of the attempt continues the trace that created the task."""
        async with self.db.read() as reader:
            row = await reader.one("task_creation_traceparent", {"task_id": task_id})
        return None if row is None else row.traceparent

    async def poll(self, worker_id: UUID, *, request_id: str | None = None, actor: str | None = None,
                   notices: bool = True, fingerprint: str | None = None) -> Poll:
        """:meth:`acquire`, plus (in the same round trip) the worker's attempts whose task is being
        cancelled — what a long-poll answer must tell the worker.

        With the caller's certificate ``fingerprint`` (the Gateway passes it), the worker's
        standing is checked in this transaction, in the same round trip as the worker lock:
        Forbidden, and nothing done, when the certificate is not ``worker_id``'s or the worker
        is revoked or disabled.

        The answer is the caller's to encode, after the transaction committed (the worker API
        does, :mod:`gateway.api.worker`): no encoding work holds the worker's and the task's row
        locks. Every task's scope and parameters are within the input limits
        (:mod:`domain.limits`; migration 0022 ended, as undeliverable, the tasks stored before
        them that were not), so every lease's answer can be encoded.
        """
        actor = actor or f"worker:{worker_id}"
        token = secrets.token_urlsafe(32)
        #: An organisation may refuse this acquire's lease (at its cap, or moved past the next
        #: in line by concurrent leases). The transaction that met a refusal holds that
        #: organisation's row lock, so it is rolled back (it never waits for a second
        #: organisation's row while holding one: no deadlock) and the acquire starts over on a
        #: fresh snapshot, which shows what refused it (committed before the refusal). Should
        #: concurrent leases keep refusing it, the later tries drop the ceilings (the order stays
        #: fair, only the spreading of simultaneous acquirers is given up), and after
        #: _MAX_TRIES the acquire answers that it found nothing (the worker polls again).
        tries = 0

        seen: dict[str, Any] = {}

        def answered(polled: Poll) -> Poll:
            return replace(polled, organizations=seen["organizations"], task_types=seen["task_types"])

        async def body(tx: Transaction) -> tuple[Poll, list[DomainEvent]]:
            params = {"worker_id": worker_id, "now": self.clock(), "request_id": request_id,
                      "fingerprint": fingerprint}
            # One round trip: the caller's standing, the worker's row (locked) and live attempts,
            # an earlier lease of this request, the cancels to tell it about.
            reads: dict[str, Read] = {}
            if fingerprint is not None:
                reads["caller"] = one("worker_by_fingerprint", params)
            reads["worker"] = one("worker_lock_for_acquire", params)
            reads["live"] = one("worker_live_attempts", params)
            if request_id is not None:
                reads["earlier"] = one("attempt_by_acquire_request", params)
            if notices:
                reads["cancelling"] = rows("worker_cancelling_attempts", params)
            reads["candidates"] = rows("fair_share_candidates", params)
            reads["organizations"] = rows("worker_organizations", params)
            answers = dict(zip(reads, await tx.read(*reads.values()), strict=True))
            row, earlier = answers["worker"], answers.get("earlier")
            seen["organizations"] = frozenset(o.organization_id for o in answers["organizations"])
            seen["task_types"] = frozenset(row.task_types) if row is not None else frozenset()
            cancelling = [(c.task_id, c.attempt_id) for c in answers.get("cancelling", ())]
            undelivered = frozenset(c.attempt_id for c in answers.get("cancelling", ()) if not c.delivered)
            if fingerprint is not None:
                caller_standing(answers["caller"], worker_id)
            if row is None:
                raise NotFound("no such worker", worker_id=str(worker_id))
            live_attempts, now = answers["live"].live, answers["live"].now
            if earlier is not None:
                task, events = await self._decide_locked(tx, earlier.task_id, ReissueLease(
                    attempt_id=earlier.id, lease_token_hash=hash_token(token)), actor)
                assert task.current_attempt is not None
                policy = (await tx.value("organization_target_policy",
                                         {"organization_id": task.organization_id})).target_policy
                return answered(Poll(Acquired(task=task, attempt=task.current_attempt, lease_token=token,
                                              target_policy=policy), cancelling, undelivered)), events
            worker = WorkerView(id=row.id, enabled=row.enabled, revoked=row.revoked,
                                max_concurrent_tasks=row.max_concurrent_tasks,
                                capabilities=frozenset(row.capabilities), task_types=frozenset(row.task_types),
                                live_attempts=live_attempts)
            if not worker.task_types:
                return answered(Poll(None, cancelling, undelivered, warning=NO_TASK_TYPES)), []
            if not worker.enabled or worker.revoked or worker.live_attempts >= worker.max_concurrent_tasks:
                return answered(Poll(None, cancelling, undelivered)), []
            candidates = [fairness.Candidate(**r._asdict()) for r in answers["candidates"]]
            lock_params = {"now": now, "task_types": sorted(worker.task_types),
                           "capabilities": sorted(worker.capabilities)}
            if tries >= _MAX_TRIES:
                return answered(Poll(None, cancelling, undelivered)), []
            for choice in fairness.preference(candidates, fair=self.fair_shares):
                ceiling = choice.ceiling if tries < _TRIES_WITH_CEILINGS else fairness.NO_CEILING
                locked: TaskGrantRow | None = await tx.one("task_lock_for_organization", {
                    **lock_params, "organization_id": choice.candidate.organization_id, "floor": choice.floor,
                    "quantum": choice.quantum, "ceiling": ceiling})
                if locked is None:  # every eligible task of it is being leased by someone else
                    continue
                if locked.virtual_time is None:  # it reached its cap, or concurrent leases moved it past the next
                    raise _Refused(choice.candidate.organization_id)
                task, head = task_from_row(locked)
                policy = locked.target_policy
                assert locked.live is not None  # set with the virtual time
                grant = fairness.grant_record(choice, candidates, virtual_time=locked.virtual_time,
                                              live=locked.live, waited_seconds=locked.waited_seconds)
                events = decide(task, GrantLease(attempt_id=self.new_id(), worker=worker,
                                                 lease_token_hash=hash_token(token), request_id=request_id,
                                                 fair_share=grant),
                                now=now, actor=actor)
                leased = project_task(events, task)
                assert leased is not None and leased.current_attempt is not None
                tx.append(head, events)
                return answered(Poll(Acquired(task=leased, attempt=leased.current_attempt, lease_token=token,
                                              target_policy=policy), cancelling, undelivered)), events
            return answered(Poll(None, cancelling, undelivered)), []

        while True:
            try:
                polled, events = await self.db.run(body)
            except _Refused:
                tries += 1
                continue
            self.observe(events)
            return polled

