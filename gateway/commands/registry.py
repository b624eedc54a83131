"""Organisations, workers, assignments and API keys: the commands that set up who may lease what.

Worker commands follow the task core's steps (see :mod:`gateway.commands.lifecycle`): lock the
worker row (``worker_lock``), read the worker and its assignments with separate statements after
the lock is granted (so they see what the previous lock holder committed), decide with
:mod:`domain.registry`, append the events and apply their projections, commit.

The worker row lock (``FOR UPDATE``) is also what orders revocation against the worker's own
writes: every worker write share-locks the same row for its whole transaction and checks the
worker's standing after the lock (``worker_lock_for_write``), so no write the revocation should
stop commits after it.

Revocation only changes the worker's own stream here; cancelling the worker's active tasks is a
task command (:meth:`gateway.commands.lifecycle.Lifecycle.cancel_worker_attempts`), one
transaction per task, run after the revocation committed.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any
from uuid import UUID, uuid4

from leasehold.domain import admission as admission_rules
from leasehold.domain import fairness
from leasehold.domain import profiles as profile_rules
from leasehold.domain import registry as rules
from leasehold.domain import targets as target_rules
from leasehold.domain.errors import Conflict, InvalidRequest, NotFound
from leasehold.domain.events import DomainEvent
from leasehold.domain.registry import Assignment, WorkerState
from leasehold.domain.targets import TargetPolicy, policy_from_json
from leasehold.gateway.commands import wakeups
from leasehold.persistence.event_log import StreamHead
from leasehold.persistence.task_rows import caller_standing
from leasehold.persistence.transaction import Clock, Database, Transaction, one, rows, system_clock

API_KEY_PREFIX = "lh_"


def _key_name(name: str) -> str:
    name = name.strip()
    if not 1 <= len(name) <= 200:
        raise InvalidRequest("key name must be 1..200 characters")
    return name


def hash_api_key(key: str) -> bytes:
    """sha256 of an operator API key: only this is stored, and keys are looked up by it."""
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A stored operator API key (never the key itself)."""

    id: UUID
    name: str
    organization_id: UUID | None  # None: an administrator key


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """A new operator API key: the only time its plaintext exists (only its sha256 is stored)."""

    id: UUID
    name: str
    organization_id: UUID | None
    key: str
    expires_at: datetime | None = None


class Registry:
    """Set-up commands. Each is one transaction; ids may be supplied or are generated."""

    def __init__(self, db: Database, *, clock: Clock = system_clock,
                 new_id: Callable[[], UUID] = uuid4) -> None:
        self.db, self.clock, self.new_id = db, clock, new_id

    # --- organisations and their keys -----------------------------------------------------

    async def create_organization(self, name: str, *, actor: str = "system") -> UUID:
        org_id = self.new_id()
        async with self.db.transaction() as tx:
            now = (await tx.value("clock_now", {"now": self.clock()})).now
            tx.append(StreamHead(org_id), [rules.create_organization(org_id, name, now=now, actor=actor)])
            await tx.commit()
        return org_id

    async def create_api_key(self, *, organization_id: UUID | None, name: str,
                             expires_at: datetime | None = None) -> IssuedKey:
        """An operator key: of one organisation (sees only it), or an administrator key (None);
        it stops working at ``expires_at`` when given.

        Keys are credentials, not domain facts: they live in ``api_keys`` (hashed), outside the
        event log, like the bootstrap administrator key.
        """
        name = _key_name(name)
        async with self.db.transaction() as tx:
            if organization_id is not None and await tx.one(
                    "organization_exists", {"organization_id": organization_id, "now": self.clock()}) is None:
                raise NotFound("no such organisation", organization_id=str(organization_id))
            issued = self._insert_key(tx, name, organization_id, expires_at)
            await tx.commit()
        return issued

    def _insert_key(self, tx: Transaction, name: str, organization_id: UUID | None,
                    expires_at: datetime | None) -> IssuedKey:
        if expires_at is not None and expires_at <= (self.clock() or datetime.now(UTC)):
            raise InvalidRequest("expires_at must be in the future")
        key_id, key = self.new_id(), API_KEY_PREFIX + secrets.token_urlsafe(32)
        tx.write("api_keys", "api_key_insert", {"id": key_id, "name": name, "organization_id": organization_id,
                                                "key_hash": hash_api_key(key), "expires_at": expires_at,
                                                "bootstrap": False})
        return IssuedKey(key_id, name, organization_id, key, expires_at)

    async def store_bootstrap_key(self, key: str) -> bool:
        """Store the administrator key the Gateway was started with (hashed) and revoke every
        earlier bootstrap key; already stored: no change. False when this very key was revoked
        before (it is not brought back: start with a new one)."""
        key_hash = hash_api_key(key)
        async with self.db.transaction() as tx:
            found = await tx.one("api_key_bootstrap_lookup", {"key_hash": key_hash})
            if found is not None and found.revoked_at is not None:
                return False
            await tx.execute("api_keys_revoke_other_bootstrap", {"key_hash": key_hash, "now": self.clock()})
            tx.write("api_keys", "api_key_insert", {"id": self.new_id(), "name": "bootstrap administrator",
                                                    "organization_id": None, "key_hash": key_hash,
                                                    "expires_at": None, "bootstrap": True})
            await tx.commit()
        return True

    async def api_key(self, key: str) -> ApiKey | None:
        """The live (not revoked, not expired) key ``key`` is, or None. Its ``last_used_at`` is
        brought up to date when it is more than a minute old (one small write per key and minute,
        ``api_key_touch``)."""
        now = self.clock()
        async with self.db.read() as reader:
            row = await reader.one("api_key_by_hash", {"key_hash": hash_api_key(key), "now": now})
        if row is None:
            return None
        found = ApiKey(row.id, row.name, row.organization_id)
        if row.touch_due:
            async with self.db.transaction() as tx:
                tx.write("api_keys", "api_key_touch", {"id": found.id, "now": now})
                await tx.commit()
        return found

    async def api_keys(self, *, organization_id: UUID | None, after: UUID | None, limit: int) -> list[Any]:
        """Stored keys (never the keys themselves), by id."""
        async with self.db.read() as reader:
            return await reader.all("api_keys_page", {"organization_id": organization_id, "after": after,
                                                      "limit": limit})

    async def api_key_row(self, key_id: UUID) -> Any:
        """The key's ``api_key_by_id`` row (read by name)."""
        async with self.db.read() as reader:
            row = await reader.one("api_key_by_id", {"id": key_id})
        if row is None:
            raise NotFound("no such API key", key_id=str(key_id))
        return row

    async def revoke_api_key(self, key_id: UUID) -> None:
        """Revoke the key (its next request answers 401); revoking a revoked key changes nothing."""
        async with self.db.transaction() as tx:
            if await tx.one("api_key_lock", {"id": key_id}) is None:
                raise NotFound("no such API key", key_id=str(key_id))
            tx.write("api_keys", "api_key_revoke", {"id": key_id, "now": self.clock(), "replaced_by": None})
            await tx.commit()

    async def rotate_api_key(self, key_id: UUID, *, expires_at: datetime | None = None) -> IssuedKey:
        """A new key with the same name and scope, and the old one revoked, in one transaction."""
        async with self.db.transaction() as tx:
            old = await tx.one("api_key_lock", {"id": key_id})
            if old is None:
                raise NotFound("no such API key", key_id=str(key_id))
            if old.revoked_at is not None:
                raise Conflict("the API key is revoked; create a new one instead", key_id=str(key_id))
            issued = self._insert_key(tx, old.name, old.organization_id, expires_at)
            tx.write("api_keys", "api_key_revoke", {"id": key_id, "now": self.clock(), "replaced_by": issued.id})
            await tx.commit()
        return issued

    async def worker_by_certificate(self, fingerprint: str) -> tuple[UUID, str]:
        """(worker id, name) of the worker the certificate belongs to; Forbidden when it belongs
        to none, or to a revoked or disabled one (:func:`persistence.task_rows.caller_standing`)."""
        async with self.db.read() as reader:
            return caller_standing(await reader.one("worker_by_fingerprint", {"fingerprint": fingerprint}))

    # --- workers --------------------------------------------------------------------------

    async def register_worker(self, *, name: str, fingerprint: str, capabilities: tuple[str, ...] = (),
                              task_types: tuple[str, ...] = (), max_concurrent_tasks: int = 1,
                              actor: str = "system") -> UUID:
        worker_id = self.new_id()
        async with self.db.transaction() as tx:
            now = (await tx.value("clock_now", {"now": self.clock()})).now
            event = rules.register_worker(worker_id, name=name, fingerprint=fingerprint,
                                          capabilities=capabilities, task_types=task_types,
                                          max_concurrent_tasks=max_concurrent_tasks, now=now, actor=actor)
            tx.append(StreamHead(worker_id), [event])
            await tx.commit()
        return worker_id

    async def update_worker(self, worker_id: UUID, *, capabilities: tuple[str, ...] | None = None,
                            task_types: tuple[str, ...] | None = None, max_concurrent_tasks: int | None = None,
                            actor: str = "system") -> WorkerState:
        """New capabilities, task types and/or capacity (None: unchanged). Takes effect on the
        worker's next acquire; leases it holds are not affected."""
        return await self._on_worker(worker_id, lambda w, now: rules.update_worker(
            w, capabilities=capabilities, task_types=task_types, max_concurrent_tasks=max_concurrent_tasks,
            now=now, actor=actor))

    async def set_worker_enabled(self, worker_id: UUID, enabled: bool, *, actor: str = "system") -> WorkerState:
        """A disabled worker is refused on its next request and leases nothing; its leases lapse
        (and their tasks are retried) unless it is enabled again in time."""
        return await self._on_worker(worker_id, lambda w, now: rules.set_worker_enabled(
            w, enabled, now=now, actor=actor))

    async def revoke_worker(self, worker_id: UUID, *, reason: str, actor: str = "system") -> WorkerState:
        """Permanent; repeating it changes nothing. Cancel its tasks afterwards."""
        return await self._on_worker(worker_id, lambda w, now: rules.revoke_worker(
            w, reason=reason, now=now, actor=actor))

    async def assign_worker(self, worker_id: UUID, organization_id: UUID, *, actor: str = "system") -> WorkerState:
        """Let the worker lease the organisation's tasks (again); already assigned: no change."""
        return await self._on_worker(worker_id, lambda w, now: rules.assign(
            w, organization_id, now=now, actor=actor), organization_id=organization_id)

    async def end_assignment(self, worker_id: UUID, organization_id: UUID, *, revoke: bool,
                             actor: str = "system") -> WorkerState:
        """Remove (routine) or revoke (security) an assignment; new leases stop at commit."""
        return await self._on_worker(worker_id, lambda w, now: rules.end_assignment(
            w, organization_id, revoke=revoke, now=now, actor=actor))

    async def _on_worker(self, worker_id: UUID, decide: Callable[[WorkerState, datetime], list[DomainEvent]],
                         *, organization_id: UUID | None = None) -> WorkerState:
        """Lock the worker, decide, append; one transaction. Returns the worker's new state."""
        async with self.db.transaction() as tx:
            worker, head, now = await _lock_worker_and_read(tx, worker_id, self.clock(), organization_id)
            events = decide(worker, now)
            tx.append(head, events)
            if events:
                tx.notify(wakeups.worker(worker_id))
            await tx.commit()
        after = rules.project_worker(events, worker)
        assert after is not None
        return after

    # --- target policy -------------------------------------------------------------------

    async def set_target_policy(self, organization_id: UUID, policy: TargetPolicy, *,
                                actor: str = "system") -> None:
        """Replace the organisation's target policy (:mod:`domain.targets`); new scans, schedules
        and tasks are checked against it, and each new lease carries it to the worker."""
        async with self.db.transaction() as tx:
            row = await tx.one("organization_lock", {"organization_id": organization_id, "now": self.clock()})
            if row is None:
                raise NotFound("no such organisation", organization_id=str(organization_id))
            tx.append(StreamHead(organization_id, row.version, bytes(row.head_hash)),
                      target_rules.set_target_policy(organization_id, row.version, policy, now=row.now, actor=actor))
            await tx.commit()

    async def target_policy(self, organization_id: UUID) -> TargetPolicy:
        async with self.db.read() as reader:
            row = await reader.one("organization_target_policy", {"organization_id": organization_id})
        if row is None:
            raise NotFound("no such organisation", organization_id=str(organization_id))
        return policy_from_json(row.target_policy)

    # --- execution mode ------------------------------------------------------------------

    async def set_gateway_execution(self, organization_id: UUID, enabled: bool, *, actor: str = "system") -> None:
        """The organisation's ``gateway_execution`` flag: off, its new scans are legacy-executed
        (running scans are not touched). Setting the current value again records nothing."""
        async with self.db.transaction() as tx:
            row = await tx.one("organization_lock", {"organization_id": organization_id, "now": self.clock()})
            if row is None:
                raise NotFound("no such organisation", organization_id=str(organization_id))
            events = profile_rules.set_organization_gateway_execution(organization_id, row.version,
                                                                      row.gateway_execution, enabled,
                                                                      now=row.now, actor=actor)
            tx.append(StreamHead(organization_id, row.version, bytes(row.head_hash)), events)
            await tx.commit()


    # --- fair shares -----------------------------------------------------------------------

    async def set_fair_share(self, organization_id: UUID, *, weight: int, max_live_attempts: int | None,
                             actor: str = "system") -> FairShareState:
        """The organisation's fair-share weight and cap of live attempts across the fleet (None:
        no cap); see :mod:`domain.fairness`. Acquisitions that start after the commit use them;
        a lower cap never ends attempts already live, it only stops new leases until enough end.
        Setting the current values again records nothing."""
        async with self.db.transaction() as tx:
            row = await tx.one("organization_lock_fair_share",
                               {"organization_id": organization_id, "now": self.clock()})
            if row is None:
                raise NotFound("no such organisation", organization_id=str(organization_id))
            events = fairness.set_fair_share(organization_id, row.version, (row.fair_weight, row.max_live_attempts),
                                             weight, max_live_attempts, now=row.now, actor=actor)
            tx.append(StreamHead(organization_id, row.version, bytes(row.head_hash)), events)
            await tx.commit()
        state = await self.fair_share(organization_id)
        assert state is not None
        return state

    async def fair_share(self, organization_id: UUID) -> FairShareState | None:
        """The organisation's fair-share settings and state, or None when there is no such organisation."""
        async with self.db.read() as reader:
            row = await reader.one("fair_share_get", {"organization_id": organization_id})
        if row is None:
            return None
        return FairShareState(organization_id=row.id, weight=row.fair_weight, max_live_attempts=row.max_live_attempts,
                              virtual_time=row.virtual_time, served=row.served, live=row.live,
                              waited_seconds=row.waited_seconds, updated_at=row.updated_at)


    # --- admission ------------------------------------------------------------------------

    async def set_admission(self, organization_id: UUID, *, max_queued_tasks: int | None,
                            max_queued_scans: int | None, reason: str, actor: str = "system") -> AdmissionState:
        """The organisation's admission caps (None: no cap); see :mod:`domain.admission`. Creations
        that start after the commit are admitted against them; a lower cap ends nothing already
        queued. Setting the current values again records nothing."""
        async with self.db.transaction() as tx:
            row = await tx.one("organization_lock_admission", {"organization_id": organization_id, "now": self.clock()})
            if row is None:
                raise NotFound("no such organisation", organization_id=str(organization_id))
            events = admission_rules.set_admission(organization_id, row.version,
                                                   (row.max_queued_tasks, row.max_queued_scans),
                                                   max_queued_tasks, max_queued_scans, reason=reason, now=row.now,
                                                   actor=actor)
            tx.append(StreamHead(organization_id, row.version, bytes(row.head_hash)), events)
            await tx.commit()
        state = await self.admission(organization_id)
        assert state is not None
        return state

    async def admission(self, organization_id: UUID) -> AdmissionState | None:
        """The organisation's admission caps and what they count now, or None when there is no such organisation."""
        async with self.db.read() as reader:
            row = await reader.one("admission_get", {"organization_id": organization_id})
        if row is None:
            return None
        return AdmissionState(organization_id=row.id, max_queued_tasks=row.max_queued_tasks,
                              max_queued_scans=row.max_queued_scans, queued_tasks=row.queued_tasks,
                              queued_scans=row.queued_scans)


@dataclass(frozen=True, slots=True)
class AdmissionState:
    """An organisation's admission caps (None: no cap) and the queued work they count now."""

    organization_id: UUID
    max_queued_tasks: int | None
    max_queued_scans: int | None
    queued_tasks: int
    queued_scans: int


@dataclass(frozen=True, slots=True)
class FairShareState:
    """An organisation's fair-share settings and the state acquisition keeps for it."""

    organization_id: UUID
    weight: int
    max_live_attempts: int | None
    virtual_time: float
    served: int
    live: int
    waited_seconds: float
    updated_at: datetime | None


async def _lock_worker_and_read(tx: Transaction, worker_id: UUID, now: datetime | None,
                                organization_id: UUID | None) -> tuple[WorkerState, StreamHead, datetime]:
    """Lock the worker row, then read it, its assignments (and the organisation a command names)
    with statements of their own, pipelined into one round trip."""
    params = {"worker_id": worker_id, "now": now, "organization_id": organization_id}
    reads = [one("worker_lock", params), one("worker_read", params), rows("worker_assignments", params)]
    if organization_id is not None:
        reads.append(one("organization_exists", params))
    locked, row, assignments, *named = await tx.read(*reads)
    if locked is None or row is None:
        raise NotFound("no such worker", worker_id=str(worker_id))
    if any(org is None for org in named):
        raise NotFound("no such organisation", organization_id=str(organization_id))
    worker = WorkerState(
        id=row.id, version=row.version, name=row.name, fingerprint=row.fingerprint, enabled=row.enabled,
        revoked=row.revoked, capabilities=tuple(row.capabilities), task_types=tuple(row.task_types),
        max_concurrent_tasks=row.max_concurrent_tasks,
        assignments=MappingProxyType({a.organization_id: Assignment(a.organization_id, a.enabled, a.revoked)
                                      for a in assignments}))
    return worker, StreamHead(row.id, row.version, bytes(row.head_hash)), row.now
