"""The task lifecycle: acquire and the long-poll's poll: choosing a task fairly and leasing it."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from uuid import UUID

from leasehold.domain import fairness
from leasehold.domain.errors import InvalidRequest, LeaseLost, NotFound
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
    lease_request_ids,
)
from leasehold.persistence.rows import TaskGrantRow
from leasehold.persistence.task_rows import (
    caller_standing,
    task_from_row,
)
from leasehold.persistence.transaction import Read, Transaction, one, rows
from leasehold.protocol.wire import MAX_MULTI_REQUEST_ID, MAX_TASKS_PER_ACQUIRE


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

    async def acquire_many(self, worker_id: UUID, max_tasks: int, *, request_id: str | None = None,
                           actor: str | None = None, fingerprint: str | None = None) -> list[Acquired]:
        """Lease up to ``max_tasks`` eligible tasks to the worker in one transaction (see :meth:`poll`)."""
        return list((await self.poll(worker_id, request_id=request_id, actor=actor, notices=False,
                                     fingerprint=fingerprint, max_tasks=max_tasks)).leases)

    async def poll(self, worker_id: UUID, *, request_id: str | None = None, actor: str | None = None,
                   notices: bool = True, fingerprint: str | None = None, max_tasks: int = 1) -> Poll:
        """:meth:`acquire`, plus (in the same round trip) the worker's attempts whose task is being
        cancelled — what a long-poll answer must tell the worker.

        With the caller's certificate ``fingerprint`` (the Gateway passes it), the worker's
        standing is checked in this transaction, in the same round trip as the worker lock:
        Forbidden, and nothing done, when the certificate is not ``worker_id``'s or the worker
        is revoked or disabled.

        ``max_tasks`` above 1 leases up to that many tasks in the one transaction (one worker
        lock, one commit), each exactly as a one-task acquire would lease it, one after the
        other: the worker's capacity counts the leases granted before it in this round, the
        organisations are chosen by the fair-share order read again after each lease (their
        virtual times and live counts as the earlier leases left them), each lease is counted
        against its organisation's cap in the statement that locks its task, and each is its own
        ``TaskLeased`` event with its own token. A lease after the first never waits for an
        organisation's row lock (the transaction holds one already: waiting for a second could
        deadlock); when that row is busy, or the organisation refuses the lease, the round ends
        with the leases it has. With a ``request_id``, its leases after the first are stored
        under :func:`~.base.lease_request_ids`: a repeat finds every one of them, and leases
        nothing more. (One wait remains possible after the first lease: a lease's projection
        moves its scan from pending to running, which waits for that scan's row if another
        transaction is changing it. Two requests of several tasks that start the same two scans
        in opposite orders can so deadlock; PostgreSQL ends one of them, which commits nothing
        and answers 409 like any raced change, and the worker asks again.)

        The answer is the caller's to encode, after the transaction committed (the worker API
        does, :mod:`gateway.api.worker`): no encoding work holds the worker's and the task's row
        locks. Every task's scope and parameters are within the input limits
        (:mod:`domain.limits`; migration 0022 ended, as undeliverable, the tasks stored before
        them that were not), so every lease's answer can be encoded.
        """
        if not 1 <= max_tasks <= MAX_TASKS_PER_ACQUIRE:
            raise InvalidRequest(f"max_tasks must be between 1 and {MAX_TASKS_PER_ACQUIRE}")
        if request_id is not None and max_tasks > 1 and len(request_id) > MAX_MULTI_REQUEST_ID:
            raise InvalidRequest(f"request_id must be at most {MAX_MULTI_REQUEST_ID} characters "
                                 "when max_tasks is above 1")
        actor = actor or f"worker:{worker_id}"
        request_ids = lease_request_ids(request_id, max_tasks) if request_id is not None else []
        #: An organisation may refuse this acquire's lease (at its cap, or moved past the next
        #: in line by concurrent leases). The transaction that met a refusal holds that
        #: organisation's row lock, so it is rolled back (it never waits for a second
        #: organisation's row while holding one: no deadlock) and the acquire starts over on a
        #: fresh snapshot, which shows what refused it (committed before the refusal). Should
        #: concurrent leases keep refusing it, the later tries drop the ceilings (the order stays
        #: fair, only the spreading of simultaneous acquirers is given up), and after
        #: _MAX_TRIES the acquire answers that it found nothing (the worker polls again).
        #: Only the round's first lease is retried so: a refusal of a later one ends the round.
        tries = 0

        seen: dict[str, Any] = {}

        def answered(polled: Poll) -> Poll:
            return replace(polled, organizations=seen["organizations"], task_types=seen["task_types"])

        def granted(leases: list[Acquired], cancelling: list[tuple[UUID, UUID]],
                    undelivered: frozenset[UUID]) -> Poll:
            return answered(Poll(next(iter(leases), None), cancelling, undelivered, leases=tuple(leases)))

        async def body(tx: Transaction) -> tuple[Poll, list[DomainEvent]]:
            params = {"worker_id": worker_id, "now": self.clock(), "request_ids": request_ids,
                      "fingerprint": fingerprint}
            # One round trip: the caller's standing, the worker's row (locked) and live attempts,
            # an earlier lease of this request, the cancels to tell it about.
            reads: dict[str, Read] = {}
            if fingerprint is not None:
                reads["caller"] = one("worker_by_fingerprint", params)
            reads["worker"] = one("worker_lock_for_acquire", params)
            reads["live"] = one("worker_live_attempts", params)
            if request_id is not None:
                reads["earlier"] = rows("attempt_by_acquire_request", params)
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
            if earlier:
                return await self._reissue(tx, earlier, request_ids, actor, cancelling, undelivered, granted)
            worker = WorkerView(id=row.id, enabled=row.enabled, revoked=row.revoked,
                                max_concurrent_tasks=row.max_concurrent_tasks,
                                capabilities=frozenset(row.capabilities), task_types=frozenset(row.task_types),
                                live_attempts=live_attempts)
            if not worker.task_types:
                return answered(Poll(None, cancelling, undelivered, warning=NO_TASK_TYPES)), []
            if not worker.enabled or worker.revoked or worker.live_attempts >= worker.max_concurrent_tasks:
                return answered(Poll(None, cancelling, undelivered)), []
            if tries >= _MAX_TRIES:
                return answered(Poll(None, cancelling, undelivered)), []
            candidates = [fairness.Candidate(**r._asdict()) for r in answers["candidates"]]
            lock_params = {"now": now, "task_types": sorted(worker.task_types),
                           "capabilities": sorted(worker.capabilities)}
            wanted = min(max_tasks, worker.max_concurrent_tasks - worker.live_attempts)
            leases: list[Acquired] = []
            appended: list[DomainEvent] = []
            while len(leases) < wanted:
                more = bool(leases)
                if more and len(candidates) > 1:
                    # The order after the earlier leases (their organisations' virtual times and
                    # live counts, and their next tasks), read again in this transaction.
                    candidates = [fairness.Candidate(**r._asdict())
                                  for r in await tx.all("fair_share_candidates", params)]
                lease = await self._lease_one(tx, worker, candidates, lock_params, request_ids[len(leases)]
                                              if request_ids else None, actor, tries=tries, more=more)
                if lease is None:
                    break
                acquired, events, candidate = lease
                leases.append(acquired)
                appended.extend(events)
                worker = replace(worker, live_attempts=worker.live_attempts + 1)
                candidates = [candidate if c.organization_id == candidate.organization_id else c
                              for c in candidates]
            return granted(leases, cancelling, undelivered), appended

        while True:
            try:
                polled, events = await self.db.run(body)
            except _Refused:
                tries += 1
                continue
            self.observe(events)
            return polled

    async def _lease_one(self, tx: Transaction, worker: WorkerView, candidates: list[fairness.Candidate],
                         lock_params: dict[str, Any], request_id: str | None, actor: str, *, tries: int,
                         more: bool) -> tuple[Acquired, list[DomainEvent], fairness.Candidate] | None:
        """Lease one task of the first organisation in fair-share order that has one for the
        worker: the lease, its events, and that organisation's candidate as the lease left it;
        None when there is none (or, for a lease after the round's first, when an organisation
        is busy or refuses: the round ends). The round's first lease raises :class:`_Refused`
        when an organisation refuses it (the caller starts over)."""
        for choice in fairness.preference(candidates, fair=self.fair_shares):
            ceiling = choice.ceiling if tries < _TRIES_WITH_CEILINGS else fairness.NO_CEILING
            locked: TaskGrantRow | None = await tx.one("task_lock_for_organization", {
                **lock_params, "organization_id": choice.candidate.organization_id, "floor": choice.floor,
                "quantum": choice.quantum, "ceiling": ceiling, "more": more})
            if locked is None:  # every eligible task of it is being leased by someone else
                if more:  # (or its row is busy, which a later lease never waits for)
                    return None
                continue
            if locked.virtual_time is None:  # it reached its cap, or concurrent leases moved it past the next
                if more:
                    return None
                raise _Refused(choice.candidate.organization_id)
            task, head = task_from_row(locked)
            assert locked.live is not None  # set with the virtual time
            grant = fairness.grant_record(choice, candidates, virtual_time=locked.virtual_time,
                                          live=locked.live, waited_seconds=locked.waited_seconds)
            token = secrets.token_urlsafe(32)
            events = decide(task, GrantLease(attempt_id=self.new_id(), worker=worker,
                                             lease_token_hash=hash_token(token), request_id=request_id,
                                             fair_share=grant),
                            now=lock_params["now"], actor=actor)
            leased = project_task(events, task)
            assert leased is not None and leased.current_attempt is not None
            tx.append(head, events)
            served = replace(choice.candidate, virtual_time=locked.virtual_time, live=locked.live)
            return (Acquired(task=leased, attempt=leased.current_attempt, lease_token=token,
                             target_policy=locked.target_policy), events, served)
        return None

    async def _reissue(self, tx: Transaction, earlier: list[Any], request_ids: list[str], actor: str,
                       cancelling: list[tuple[UUID, UUID]], undelivered: frozenset[UUID],
                       granted: Callable[[list[Acquired], list[tuple[UUID, UUID]], frozenset[UUID]], Poll],
                       ) -> tuple[Poll, list[DomainEvent]]:
        """A repeated acquire: the attempts its request id created, each with a fresh token (those
        that ended are left out; when every one has ended, the repeat is refused as before)."""
        order = {rid: n for n, rid in enumerate(request_ids)}
        leases: list[Acquired] = []
        appended: list[DomainEvent] = []
        lost: LeaseLost | None = None
        for attempt in sorted(earlier, key=lambda a: order.get(a.acquire_request_id, len(order))):
            token = secrets.token_urlsafe(32)
            try:
                task, events = await self._decide_locked(tx, attempt.task_id, ReissueLease(
                    attempt_id=attempt.id, lease_token_hash=hash_token(token)), actor)
            except LeaseLost as exc:
                lost = exc
                continue
            assert task.current_attempt is not None
            policy = (await tx.value("organization_target_policy",
                                     {"organization_id": task.organization_id})).target_policy
            leases.append(Acquired(task=task, attempt=task.current_attempt, lease_token=token,
                                   target_policy=policy))
            appended.extend(events)
        if not leases and lost is not None:
            raise lost
        return granted(leases, cancelling, undelivered), appended
