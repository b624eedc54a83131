"""Opening a scan in the mode its flags decide (see :mod:`domain.profiles`), inside the caller's
transaction: :meth:`gateway.commands.Registry.create_scan` and the legacy queue drain
(:mod:`gateway.commands.legacy`) both create scans this way.

Locks, in this order: the organisation's row ``FOR SHARE`` (its flag), then the stored profile's
row ``FOR SHARE`` when the scan names one. A flag change or a profile edit takes the row
``FOR UPDATE``, so it waits for the scans being created and every scan created after it commits
sees it: after ``gateway_execution`` is turned off, no new scan is Gateway-executed.

A Gateway-executed scan with a profile gets its first step's job and task at once (later ones
as earlier ones end). A legacy-executed scan gets one ``legacy`` job per step and no task, ever:
:meth:`Lifecycle.create_task` refuses legacy scans, orchestration never runs for a scan without
tasks, and the database refuses a worker task on a legacy job (migration 0007).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncCursor

from domain import scan as scan_rules
from domain.errors import InvalidRequest, NotFound
from domain.events import DomainEvent, ExecutionMode, ProfileStep
from domain.profiles import LegacyExecuted, execution_mode
from gateway.commands.lifecycle import profile_steps, queue_step
from persistence.event_log import StreamHead, append
from persistence.queries import QUERIES


@dataclass(frozen=True, slots=True)
class OpenedScan:
    id: UUID
    mode: ExecutionMode
    now: datetime


async def open_scan(cur: AsyncCursor[Any], scan_id: UUID, organization_id: UUID, targets: dict[str, Any], *,
                    clock: datetime | None, actor: str, new_id: Callable[[], UUID],
                    execution_mode_wanted: ExecutionMode | None = None, steps: Sequence[ProfileStep] = (),
                    profile_name: str | None = None, legacy_scan_id: str | None = None,
                    legacy_message_sha256: str | None = None) -> OpenedScan:
    """Append the new scan's events (and its first task, when Gateway-executed) in ``cur``'s
    transaction.

    ``execution_mode_wanted``: None lets the flags decide; ``"legacy"`` records a legacy scan
    whatever they say; ``"gateway"`` raises :class:`LegacyExecuted` when they say legacy.
    ``profile_name`` names a stored profile (its steps are copied), ``steps`` are inline steps.
    A legacy record is keyed on ``legacy_scan_id``, by default its own id.
    """
    if steps and profile_name is not None:
        raise InvalidRequest("give a profile's steps or a stored profile's name, not both")
    await cur.execute(QUERIES["organization_mode_for_scan"], {"organization_id": organization_id, "now": clock})
    row = await cur.fetchone()
    if row is None:
        raise NotFound("no such organisation", organization_id=str(organization_id))
    organization_gateway, now = row
    stored_profile_id: UUID | None = None
    profile_gateway: bool | None = None
    if profile_name is not None:
        await cur.execute(QUERIES["stored_profile_for_scan"], {"name": profile_name,
                                                               "organization_id": organization_id})
        found = await cur.fetchone()
        if found is None:
            raise NotFound(f"no such profile {profile_name!r}")
        stored_profile_id, stored, profile_gateway = found
        steps = profile_steps(stored)
    mode = execution_mode(organization_gateway, profile_gateway)
    if execution_mode_wanted == "legacy":
        mode = "legacy"
    elif execution_mode_wanted == "gateway" and mode != "gateway":
        which = (f"profile {profile_name!r} is" if organization_gateway else f"organisation {organization_id} is")
        raise LegacyExecuted(f"{which} legacy-executed (gateway_execution is off): the scan would not run "
                             "on the Gateway", organization_id=str(organization_id))
    if mode == "legacy" and legacy_scan_id is None:
        legacy_scan_id = str(scan_id)
    events: list[DomainEvent] = [scan_rules.create_scan(scan_id, organization_id, targets, mode, now=now,
                                                        actor=actor)]
    if steps:
        events.append(scan_rules.set_profile(scan_id, len(events), steps, now=now, actor=actor))
    events += scan_rules.record_origin(scan_id, len(events), stored_profile_id=stored_profile_id,
                                       legacy_scan_id=legacy_scan_id, legacy_message_sha256=legacy_message_sha256,
                                       now=now, actor=actor)
    if mode == "legacy":
        # The legacy worker runs every step; the Gateway only records that the jobs exist.
        for position, step in enumerate(steps):
            events.append(scan_rules.queue_job(
                scan_id, len(events), "pending", organization_id=organization_id, job_id=new_id(),
                position=position, plugin=step.task_type, execution_mode="legacy", now=now, actor=actor))
    head = await append(cur, StreamHead(scan_id), events)
    if mode == "gateway" and steps:
        await queue_step(cur, head, organization_id, 0, steps[0], dict(targets), now=now, actor=actor,
                         new_id=new_id)
    return OpenedScan(scan_id, mode, now)
