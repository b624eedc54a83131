"""Organisations, workers, assignments, API keys and scans: the commands that set up who may
lease what.

Worker commands follow the task core's steps (see :mod:`gateway.commands.lifecycle`): lock the
worker row (``worker_lock``), read the worker and its assignments with separate statements after
the lock is granted (so they see what the previous lock holder committed), decide with
:mod:`domain.registry`, append the events and apply their projections, commit.

Revocation only changes the worker's own stream here; cancelling the worker's active tasks is a
task command (:meth:`gateway.commands.lifecycle.Lifecycle.cancel_worker_attempts`), one
transaction per task, run after the revocation committed.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any
from uuid import UUID, uuid4

from psycopg import AsyncCursor
from psycopg_pool import AsyncConnectionPool

from domain import profiles as profile_rules
from domain import registry as rules
from domain.errors import InvalidRequest, NotFound
from domain.events import DomainEvent, ExecutionMode, ProfileStep
from domain.registry import Assignment, WorkerState
from gateway.commands.modes import open_scan
from persistence.event_log import StreamHead, append
from persistence.queries import QUERIES
from persistence.transaction import Clock, system_clock, transaction

API_KEY_PREFIX = "lh_"


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """A new operator API key: the only time its plaintext exists (only its sha256 is stored)."""

    id: UUID
    name: str
    organization_id: UUID | None
    key: str


class Registry:
    """Set-up commands. Each is one transaction; ids may be supplied or are generated."""

    def __init__(self, pool: AsyncConnectionPool, *, clock: Clock = system_clock,
                 new_id: Callable[[], UUID] = uuid4) -> None:
        self.pool, self.clock, self.new_id = pool, clock, new_id

    # --- organisations and their keys -----------------------------------------------------

    async def create_organization(self, name: str, *, actor: str = "system") -> UUID:
        org_id = self.new_id()
        async with transaction(self.pool) as cur:
            await cur.execute(QUERIES["clock_now"], {"now": self.clock()})
            (now,) = await _one(cur)
            event = rules.create_organization(org_id, name, now=now, actor=actor)
            await append(cur, StreamHead(org_id), [event])
        return org_id

    async def create_api_key(self, *, organization_id: UUID | None, name: str) -> IssuedKey:
        """An operator key: of one organisation (sees only it), or an administrator key (None).

        Keys are credentials, not domain facts: they live in ``api_keys`` (hashed), outside the
        event log, like the bootstrap administrator key.
        """
        name = name.strip()
        if not 1 <= len(name) <= 200:
            raise InvalidRequest("key name must be 1..200 characters")
        key_id, key = self.new_id(), API_KEY_PREFIX + secrets.token_urlsafe(32)
        async with transaction(self.pool) as cur:
            if organization_id is not None:
                await cur.execute(QUERIES["organization_exists"], {"organization_id": organization_id,
                                                                   "now": self.clock()})
                if await cur.fetchone() is None:
                    raise NotFound("no such organisation", organization_id=str(organization_id))
            await cur.execute(QUERIES["api_key_insert"], {"id": key_id, "name": name,
                                                          "organization_id": organization_id,
                                                          "key_hash": _key_hash(key)})
        return IssuedKey(key_id, name, organization_id, key)

    # --- workers --------------------------------------------------------------------------

    async def register_worker(self, *, name: str, fingerprint: str, capabilities: tuple[str, ...] = (),
                              task_types: tuple[str, ...] = (), max_concurrent_tasks: int = 1,
                              actor: str = "system") -> UUID:
        worker_id = self.new_id()
        async with transaction(self.pool) as cur:
            await cur.execute(QUERIES["clock_now"], {"now": self.clock()})
            (now,) = await _one(cur)
            event = rules.register_worker(worker_id, name=name, fingerprint=fingerprint,
                                          capabilities=capabilities, task_types=task_types,
                                          max_concurrent_tasks=max_concurrent_tasks, now=now, actor=actor)
            await append(cur, StreamHead(worker_id), [event])
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
        async with transaction(self.pool) as cur:
            worker, head, now = await _lock_worker_and_read(cur, worker_id, self.clock(), organization_id)
            events = decide(worker, now)
            await append(cur, head, events)
        after = rules.project_worker(events, worker)
        assert after is not None
        return after

    # --- scans ----------------------------------------------------------------------------

    async def create_scan(self, organization_id: UUID, targets: dict[str, Any], *,
                          execution_mode: ExecutionMode | None = None, profile: Sequence[ProfileStep] = (),
                          profile_name: str | None = None, legacy_scan_id: str | None = None,
                          actor: str = "system") -> UUID:
        """A scan, with an inline ``profile`` (ordered plugin steps) or the steps of the stored
        profile ``profile_name`` (copied: later edits of the stored profile do not change it).

        Its mode comes from the flags (:mod:`domain.profiles`) unless ``execution_mode`` is given
        (``"gateway"`` against the flags raises :class:`domain.profiles.LegacyExecuted`). A
        Gateway-executed scan gets its first step's job and task in the same transaction, scoped
        to ``targets``; later steps are created as earlier ones end (see
        :meth:`gateway.commands.lifecycle.Lifecycle._settle_scan`). A legacy-executed one gets a
        ``legacy`` job per step and no task (see :mod:`gateway.commands.modes`).
        """
        scan_id = self.new_id()
        async with transaction(self.pool) as cur:
            await open_scan(cur, scan_id, organization_id, targets, clock=self.clock(), actor=actor,
                            new_id=self.new_id, execution_mode_wanted=execution_mode, steps=profile,
                            profile_name=profile_name, legacy_scan_id=legacy_scan_id)
        return scan_id

    async def set_gateway_execution(self, organization_id: UUID, enabled: bool, *, actor: str = "system") -> None:
        """The organisation's ``gateway_execution`` flag: off, its new scans are legacy-executed
        (running scans are not touched). Setting the current value again records nothing."""
        async with transaction(self.pool) as cur:
            await cur.execute(QUERIES["organization_lock"], {"organization_id": organization_id, "now": self.clock()})
            row = await cur.fetchone()
            if row is None:
                raise NotFound("no such organisation", organization_id=str(organization_id))
            _, version, head_hash, current, now = row
            events = profile_rules.set_organization_gateway_execution(organization_id, version, current, enabled,
                                                                      now=now, actor=actor)
            await append(cur, StreamHead(organization_id, version, bytes(head_hash)), events)


async def _lock_worker_and_read(cur: AsyncCursor[Any], worker_id: UUID, now: datetime | None,
                                organization_id: UUID | None) -> tuple[WorkerState, StreamHead, datetime]:
    """Lock the worker row, then read it, its assignments (and the organisation a command names)
    with statements of their own, pipelined into one round trip."""
    params = {"worker_id": worker_id, "now": now, "organization_id": organization_id}
    conn = cur.connection
    async with conn.cursor() as lock_cur, conn.cursor() as assignments_cur, conn.cursor() as org_cur:
        await lock_cur.execute(QUERIES["worker_lock"], params)
        await cur.execute(QUERIES["worker_read"], params)
        await assignments_cur.execute(QUERIES["worker_assignments"], params)
        if organization_id is not None:
            await org_cur.execute(QUERIES["organization_exists"], params)
        locked = await lock_cur.fetchone()
        assignments = await assignments_cur.fetchall()
        org = await org_cur.fetchone() if organization_id is not None else ()
    row = await cur.fetchone()
    if locked is None or row is None:
        raise NotFound("no such worker", worker_id=str(worker_id))
    if org is None:
        raise NotFound("no such organisation", organization_id=str(organization_id))
    (wid, version, head_hash, name, fingerprint, enabled, revoked, capabilities, task_types, capacity,
     at) = row
    worker = WorkerState(
        id=wid, version=version, name=name, fingerprint=fingerprint, enabled=enabled, revoked=revoked,
        capabilities=tuple(capabilities), task_types=tuple(task_types), max_concurrent_tasks=capacity,
        assignments=MappingProxyType({org_id: Assignment(org_id, on, off) for org_id, on, off in assignments}))
    return worker, StreamHead(wid, version, bytes(head_hash)), at


def _key_hash(key: str) -> bytes:
    """sha256 of the key, as ``gateway.auth`` looks keys up (not imported: the HTTP layer depends
    on the service layer, not the reverse)."""
    return hashlib.sha256(key.encode()).digest()


async def _one(cur: Any) -> Any:
    row = await cur.fetchone()
    assert row is not None
    return row
