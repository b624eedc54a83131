"""Stored profiles and execution modes: which new scans the Gateway executes.

A **stored profile** is a named, ordered list of plugin steps (:class:`~domain.events.ProfileStep`)
of one organisation, or a global one (``organization_id`` None, stored by administrators, visible
to every organisation). A scan created "by name" copies the steps at that moment
(``ScanProfileSet``), so later edits of the stored profile never change an existing scan. Names
are unique per organisation among profiles not deleted; an organisation's own profile hides a
global one of the same name.

**Execution modes** (RFC "Data migration and compatibility"): every scan and scan job is
``gateway`` or ``legacy`` executed, decided once, when the scan is created, by two flags:

* the organisation's ``gateway_execution`` (on for a new organisation; administrators switch it),
* the stored profile's ``gateway_execution`` (on for a new profile), when the scan uses one.

A new scan is Gateway-executed **iff the organisation's flag is on AND (it uses no stored profile,
or that profile's flag is on)** — :func:`execution_mode`. So the organisation's flag is the
rollback switch: off, no new scan of the organisation is Gateway-executed, whatever its profiles
say; a profile's flag can only keep one profile on the legacy path. Turning a flag changes no
existing scan: a running Gateway scan goes on through its later steps.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from leasehold.domain.errors import Conflict, InvalidRequest
from leasehold.domain.events import (
    ExecutionMode,
    OrganizationGatewayExecutionSet,
    ProfileDeleted,
    ProfileGatewayExecutionSet,
    ProfileReplaced,
    ProfileStep,
    ProfileStored,
)
from leasehold.domain.scan import validate_steps

#: Visible characters at both ends, at most 100 in all (the API's label rule). ``\Z``, not ``$``,
#: which would let a trailing newline through.
PROFILE_NAME = re.compile(r"\A\S(.{0,98}\S)?\Z")


class LegacyExecuted(Conflict):
    """The flags make this scan legacy-executed, and it was asked for Gateway execution."""

    code = "legacy-executed"


def execution_mode(organization_gateway: bool, profile_gateway: bool | None) -> ExecutionMode:
    """The mode of a new scan: ``profile_gateway`` is the stored profile's flag, None when the
    scan uses no stored profile (an inline profile, or none)."""
    return "gateway" if organization_gateway and profile_gateway is not False else "legacy"


@dataclass(frozen=True, slots=True)
class StoredProfileState:
    """A stored profile as its stream left it (read under its row lock)."""

    id: UUID
    version: int
    organization_id: UUID | None
    name: str
    steps: tuple[ProfileStep, ...]
    gateway_execution: bool
    deleted: bool = False


def check_name(name: str) -> str:
    if not PROFILE_NAME.match(name):
        raise InvalidRequest("a profile name has 1..100 characters and no white space at either end")
    return name


def store(profile_id: UUID, organization_id: UUID | None, *, name: str, steps: Sequence[ProfileStep],
          gateway_execution: bool = True, now: datetime, actor: str) -> ProfileStored:
    validate_steps(steps)
    return ProfileStored(originator_id=profile_id, originator_version=1, timestamp=now, actor=actor,
                         organization_id=organization_id, name=check_name(name), steps=tuple(steps),
                         gateway_execution=gateway_execution)


def replace(profile: StoredProfileState, steps: Sequence[ProfileStep], *, now: datetime,
            actor: str) -> list[ProfileReplaced]:
    """New steps; the same steps again is a no-op."""
    validate_steps(steps)
    if tuple(steps) == profile.steps:
        return []
    return [ProfileReplaced(originator_id=profile.id, originator_version=profile.version + 1, timestamp=now,
                            actor=actor, steps=tuple(steps))]


def set_gateway_execution(profile: StoredProfileState, enabled: bool, *, now: datetime,
                          actor: str) -> list[ProfileGatewayExecutionSet]:
    if enabled == profile.gateway_execution:
        return []
    return [ProfileGatewayExecutionSet(originator_id=profile.id, originator_version=profile.version + 1,
                                       timestamp=now, actor=actor, enabled=enabled)]


def delete(profile: StoredProfileState, *, now: datetime, actor: str) -> list[ProfileDeleted]:
    return [ProfileDeleted(originator_id=profile.id, originator_version=profile.version + 1, timestamp=now,
                           actor=actor)]


def set_organization_gateway_execution(organization_id: UUID, version: int, current: bool, enabled: bool, *,
                                       now: datetime, actor: str) -> list[OrganizationGatewayExecutionSet]:
    """The organisation's flag; setting the value it already has is a no-op."""
    if enabled == current:
        return []
    return [OrganizationGatewayExecutionSet(originator_id=organization_id, originator_version=version + 1,
                                            timestamp=now, actor=actor, enabled=enabled)]
