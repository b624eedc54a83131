"""Stored profiles: store, read, list, replace, switch Gateway execution, delete.

Each change is one transaction on the profile's own stream: lock its row
(``stored_profile_lock``, which also reads it: the columns of the locked row itself are current
under READ COMMITTED), decide with :mod:`domain.profiles`, append, commit. ``owner`` None is an
administrator (any profile); an organisation id restricts a change to that organisation's
profiles (global profiles belong to administrators). Reads take ``visible_to``: an organisation
sees its own profiles and the global ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from leasehold.domain import profiles as rules
from leasehold.domain.errors import Conflict, NotFound
from leasehold.domain.events import DomainEvent, ProfileStep
from leasehold.domain.profiles import StoredProfileState
from leasehold.gateway.commands.scans import profile_steps
from leasehold.persistence.event_log import StreamHead
from leasehold.persistence.transaction import Clock, Database, system_clock

_NAME_INDEX = "stored_profiles_name_idx"


class Profiles:
    """Stored-profile commands and reads; ids may be supplied or are generated."""

    def __init__(self, db: Database, *, clock: Clock = system_clock,
                 new_id: Callable[[], UUID] = uuid4) -> None:
        self.db, self.clock, self.new_id = db, clock, new_id

    async def create(self, organization_id: UUID | None, *, name: str, steps: Sequence[ProfileStep],
                     gateway_execution: bool = True, actor: str = "system") -> UUID:
        """A profile of the organisation, or a global one (``organization_id`` None)."""
        profile_id = self.new_id()
        try:
            async with self.db.transaction() as tx:
                if organization_id is None:
                    now = (await tx.value("clock_now", {"now": self.clock()})).now
                else:
                    found = await tx.one("organization_exists", {"organization_id": organization_id,
                                                                 "now": self.clock()})
                    if found is None:
                        raise NotFound("no such organisation", organization_id=str(organization_id))
                    now = found.now
                event = rules.store(profile_id, organization_id, name=name, steps=steps,
                                    gateway_execution=gateway_execution, now=now, actor=actor)
                tx.append(StreamHead(profile_id), [event])
                await tx.commit()
        except Conflict as exc:
            if exc.details.get("constraint") == _NAME_INDEX:
                raise Conflict(f"a profile named {name!r} already exists there", name=name) from exc
            raise
        return profile_id

    async def get(self, profile_id: UUID, *, visible_to: UUID | None = None) -> dict[str, Any]:
        async with self.db.read() as reader:
            found = await reader.dicts("stored_profile_get", {"profile_id": profile_id, "visible_to": visible_to})
        for profile in found:
            return profile
        raise NotFound("no such profile", profile_id=str(profile_id))

    async def list(self, *, visible_to: UUID | None = None, limit: int = 500) -> list[dict[str, Any]]:
        async with self.db.read() as reader:
            return await reader.dicts("stored_profiles_list", {"visible_to": visible_to, "limit": limit})

    async def replace(self, profile_id: UUID, steps: Sequence[ProfileStep], *, owner: UUID | None = None,
                      actor: str = "system") -> None:
        """New steps for the scans created from now on (existing scans keep theirs)."""
        await self._on_profile(profile_id, owner, lambda p, now: rules.replace(p, steps, now=now, actor=actor))

    async def set_gateway_execution(self, profile_id: UUID, enabled: bool, *, owner: UUID | None = None,
                                    actor: str = "system") -> None:
        await self._on_profile(profile_id, owner, lambda p, now: rules.set_gateway_execution(
            p, enabled, now=now, actor=actor))

    async def delete(self, profile_id: UUID, *, owner: UUID | None = None, actor: str = "system") -> None:
        await self._on_profile(profile_id, owner, lambda p, now: rules.delete(p, now=now, actor=actor))

    async def _on_profile(self, profile_id: UUID, owner: UUID | None,
                          decide: Callable[[StoredProfileState, datetime], Sequence[DomainEvent]]) -> None:
        async with self.db.transaction() as tx:
            row = await tx.one("stored_profile_lock", {"profile_id": profile_id, "owner": owner, "now": self.clock()})
            if row is None:
                raise NotFound("no such profile", profile_id=str(profile_id))
            state = StoredProfileState(id=row.id, version=row.version, organization_id=row.organization_id,
                                       name=row.name, steps=tuple(profile_steps(row.profile)),
                                       gateway_execution=row.gateway_execution)
            tx.append(StreamHead(row.id, row.version, bytes(row.head_hash)), decide(state, row.now))
            await tx.commit()
