"""Scan orchestration: opening a scan in its mode, queueing its profile's steps as tasks, settling
its status as tasks end, and cancelling it.

The functions here run inside a caller's transaction (they are shared by the scan commands, the
task lifecycle, the scheduler and the legacy drain); :class:`Scans` holds the commands that are
transactions of their own.

**Opening a scan** (:func:`open_scan`) decides its mode from the flags (:mod:`domain.profiles`).
Locks, in this order: the organisation's row ``FOR SHARE`` (its flag), then the stored
profile's row ``FOR SHARE`` when the scan names one. A flag change or a profile edit takes the
row ``FOR UPDATE``, so it waits for the scans being created, and every scan created after it
commits sees it: after ``gateway_execution`` is turned off, no new scan is Gateway-executed.
A Gateway-executed scan with a profile gets its first step's job and task at once, later ones
as earlier ones end (:func:`settle_scan`). A legacy-executed scan gets one ``legacy`` job per
step and no task, ever: :meth:`gateway.commands.lifecycle.Lifecycle.create_task` refuses legacy
scans, orchestration never runs for a scan without tasks, and the database refuses a worker
task on a legacy job (migration 0007).

**Settling** runs in the transaction of the task command that ended a task, which holds the
task's lock; it then locks the scan (lock order: task, then scan).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID, uuid4

from leasehold.domain import scan as scan_rules
from leasehold.domain.errors import InvalidRequest, NotFound
from leasehold.domain.events import DomainEvent, ExecutionMode, ProfileStep, ScanStatus
from leasehold.domain.profiles import LegacyExecuted, execution_mode
from leasehold.domain.schedule import ScheduleState
from leasehold.domain.scopes import PagedScope
from leasehold.domain.targets import check_scope, policy_from_json
from leasehold.domain.task import CreateTask, TaskState, decide
from leasehold.gateway.commands import admission, wakeups
from leasehold.gateway.commands.idempotency import IdempotencyKey, claim, created
from leasehold.gateway.commands.scopes import next_step_scope, paged
from leasehold.gateway.commands.webhooks import notify_scan_finished
from leasehold.persistence.event_log import StreamHead
from leasehold.persistence.transaction import Clock, Database, Transaction, one, system_clock
from leasehold.protocol.targets import resolve_names

Observer = Callable[[Sequence[DomainEvent]], None]


def profile_steps(profile: dict[str, Any] | None) -> list[ProfileStep]:
    """The steps of a scan's stored profile (``scans.profile``); none for an ad-hoc scan."""
    if not profile:
        return []
    return [ProfileStep(**{**step, "required_capabilities": tuple(step["required_capabilities"])})
            for step in profile["steps"]]


def queue_step(tx: Transaction, scan: StreamHead, organization_id: UUID, index: int, step: ProfileStep,
               scope: dict[str, Any] | PagedScope, *, now: datetime, actor: str, new_id: Callable[[], UUID],
               status: ScanStatus = "pending") -> list[DomainEvent]:
    """Queue profile step ``index`` as job ``index`` of the scan and create its task, inside the
    caller's transaction, which holds the scan lock (``scan`` is its head). A scope not paged yet
    is paged here (and its stored pages queued)."""
    job_id, task_id = new_id(), new_id()
    queued = scan_rules.queue_job(
        scan.id, scan.version, status, organization_id=organization_id,
        job_id=job_id, position=index, plugin=step.task_type, execution_mode="gateway", now=now, actor=actor)
    created = decide(None, CreateTask(
        task_id=task_id, scan_id=scan.id, scan_job_id=job_id, organization_id=organization_id,
        task_type=step.task_type, required_capabilities=step.required_capabilities, priority=step.priority,
        scope=paged(tx, scope), parameters={"profile_step": index}, max_attempts=step.max_attempts,
        lease_seconds=step.lease_seconds, execution_timeout_seconds=step.execution_timeout_seconds),
        now=now, actor=actor)
    tx.append(scan, [queued])
    tx.append(StreamHead(task_id), created)
    tx.notify(wakeups.available(organization_id))
    return [queued, *created]


@dataclass(frozen=True, slots=True)
class OpenedScan:
    id: UUID
    mode: ExecutionMode
    now: datetime


async def open_scan(tx: Transaction, scan_id: UUID, organization_id: UUID, targets: dict[str, Any], *,
                    clock: datetime | None, actor: str, new_id: Callable[[], UUID],
                    execution_mode_wanted: ExecutionMode | None = None, steps: Sequence[ProfileStep] = (),
                    profile_name: str | None = None, legacy_scan_id: str | None = None,
                    legacy_message_sha256: str | None = None,
                    resolved: Mapping[str, Sequence[str]] | None = None) -> OpenedScan:
    """Append the new scan's events (and its first task, when Gateway-executed) in ``tx``.

    ``execution_mode_wanted``: None lets the flags decide; ``"legacy"`` records a legacy scan
    whatever they say; ``"gateway"`` raises :class:`LegacyExecuted` when they say legacy.
    ``profile_name`` names a stored profile (its steps are copied), ``steps`` are inline steps.
    A legacy record is keyed on ``legacy_scan_id``, by default its own id.

    A Gateway-executed scan's targets must pass the organisation's target policy
    (:mod:`domain.targets`; ``resolved``: the addresses the caller resolved their names to).
    """
    if steps and profile_name is not None:
        raise InvalidRequest("give a profile's steps or a stored profile's name, not both")
    row = await tx.one("organization_mode_for_scan", {"organization_id": organization_id, "now": clock})
    if row is None:
        raise NotFound("no such organisation", organization_id=str(organization_id))
    organization_gateway, now, target_policy = row.gateway_execution, row.now, row.target_policy
    stored_profile_id: UUID | None = None
    profile_gateway: bool | None = None
    if profile_name is not None:
        found = await tx.one("stored_profile_for_scan", {"name": profile_name, "organization_id": organization_id})
        if found is None:
            raise NotFound(f"no such profile {profile_name!r}")
        stored_profile_id, profile_gateway = found.id, found.gateway_execution
        steps = profile_steps(found.profile)
    mode = execution_mode(organization_gateway, profile_gateway)
    if execution_mode_wanted == "legacy":
        mode = "legacy"
    elif execution_mode_wanted == "gateway" and mode != "gateway":
        which = (f"profile {profile_name!r} is" if organization_gateway else f"organisation {organization_id} is")
        raise LegacyExecuted(f"{which} legacy-executed (gateway_execution is off): the scan would not run "
                             "on the Gateway", organization_id=str(organization_id))
    if mode == "gateway":
        check_scope(policy_from_json(target_policy), targets, resolved)
        await admission.admit(tx, "scan", organization_id, row.max_queued_scans)
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
    head = tx.append(StreamHead(scan_id), events)
    if mode == "gateway" and steps:
        queue_step(tx, head, organization_id, 0, next(iter(steps)), dict(targets), now=now, actor=actor,
                   new_id=new_id)
    return OpenedScan(scan_id, mode, now)


async def open_scheduled_scan(tx: Transaction, scan_id: UUID, schedule: ScheduleState, *, now: datetime,
                              actor: str, new_id: Callable[[], UUID]) -> None:
    """Open a scan with the schedule's targets and profile, inside the caller's transaction (the
    same events :meth:`Scans.create_scan` appends).

    Scheduled scans run on the Gateway only: while the organisation's ``gateway_execution`` is
    off this raises :class:`LegacyExecuted`, so the slot stays due (the claim backs the schedule
    off) and is handled by the misfire policy once the flag is back on.
    """
    if not schedule.profile:
        raise InvalidRequest("the schedule has no profile")
    await open_scan(tx, scan_id, schedule.organization_id, dict(schedule.targets), clock=now, actor=actor,
                    new_id=new_id, execution_mode_wanted="gateway", steps=schedule.profile)


async def settle_scan(tx: Transaction, scan_id: UUID, now: datetime, *,
                      new_id: Callable[[], UUID]) -> list[DomainEvent]:
    """A task of the scan just ended: lock the scan, start the next profile step if one is due,
    else finish the scan once every job is terminal. The events it appended.

    The jobs are summarised by a second statement after the lock is granted, so under READ
    COMMITTED the summary includes every job change committed by earlier holders of the scan
    lock (and this transaction's own, already applied).
    """
    scan_row, summary = await tx.read(one("scan_lock_for_orchestration", {"scan_id": scan_id}),
                                      one("scan_jobs_summary", {"scan_id": scan_id}))
    assert scan_row is not None, "the foreign key guarantees the scan"
    statuses, job_count, last_status = summary.statuses, summary.jobs, summary.last_status
    version, head_hash, scan_status = scan_row.version, scan_row.head_hash, scan_row.status
    cancel_requested, org_id, profile, targets = (scan_row.cancel_requested, scan_row.organization_id,
                                                  scan_row.profile, scan_row.targets)
    if scan_status in scan_rules.TERMINAL_SCAN_STATUSES:
        return []
    head = StreamHead(scan_id, version, bytes(head_hash))
    steps = profile_steps(profile)
    step = scan_rules.next_step(steps, job_count, last_status, cancel_requested=cancel_requested)
    if step is not None:
        scope = await next_step_scope(tx, scan_id, targets)
        return queue_step(tx, head, org_id, step, steps[step], scope, now=now, actor="system", new_id=new_id,
                          status=scan_status)
    outcome = scan_rules.scan_outcome(statuses, cancel_requested=cancel_requested)
    if outcome is None:
        return []
    finished = scan_rules.finish_scan(scan_id, version, outcome, now=now, actor="system")
    tx.append(head, [finished])
    notify_scan_finished(tx, org_id, scan_id, outcome, now)
    return [finished]


class CancelsTasks(Protocol):
    """What cancelling a scan needs of the task lifecycle."""

    async def request_cancel(self, task_id: UUID, *, reason: str = ..., actor: str = ...) -> TaskState: ...


class Scans:
    """Scan commands. Each is one transaction (cancelling: one, then one per task)."""

    def __init__(self, db: Database, tasks: CancelsTasks, *, clock: Clock = system_clock,
                 new_id: Callable[[], UUID] = uuid4) -> None:
        self.db, self.tasks, self.clock, self.new_id = db, tasks, clock, new_id
        #: Called with the events of every committed command (metrics hook).
        self.observe: Observer = lambda events: None

    async def create_scan(self, organization_id: UUID, targets: dict[str, Any], *,
                          execution_mode: ExecutionMode | None = None, profile: Sequence[ProfileStep] = (),
                          profile_name: str | None = None, legacy_scan_id: str | None = None,
                          actor: str = "system", idempotency: IdempotencyKey | None = None) -> UUID:
        """A scan, with an inline ``profile`` (ordered plugin steps) or the steps of the stored
        profile ``profile_name`` (copied: later edits of the stored profile do not change it).

        Its mode comes from the flags (:mod:`domain.profiles`) unless ``execution_mode`` is given
        (``"gateway"`` against the flags raises :class:`domain.profiles.LegacyExecuted`). A
        Gateway-executed scan gets its first step's job and task in the same transaction, scoped
        to ``targets``; later steps are created as earlier ones end (:func:`settle_scan`). A
        legacy-executed one gets a ``legacy`` job per step and no task.

        With ``idempotency``, a request already made with that key creates nothing and raises
        :class:`~gateway.commands.idempotency.AlreadyCreated` with its scan's id.
        """
        scan_id = self.new_id()
        resolved = await resolve_names(targets)  # before the transaction: no lock waits on DNS
        async with self.db.transaction() as tx:
            await claim(tx, idempotency, self.clock())
            created(tx, idempotency, scan_id)
            await open_scan(tx, scan_id, organization_id, targets, clock=self.clock(), actor=actor,
                            new_id=self.new_id, execution_mode_wanted=execution_mode, steps=profile,
                            profile_name=profile_name, legacy_scan_id=legacy_scan_id, resolved=resolved)
            await tx.commit()
        return scan_id

    async def cancel_scan(self, scan_id: UUID, *, reason: str = "scan cancelled", actor: str = "system",
                          organization_id: UUID | None = None) -> list[TaskState]:
        """Record the scan's cancel request (no further profile steps), then cancel each of its
        unfinished tasks in a transaction of its own (task lock only: the scan lock is never held
        while waiting for a task lock). The scan ends ``cancelled`` when its last job ends (pending
        tasks at once, running ones on the worker's acknowledgement or the sweeper's grace).
        Safe to repeat. The tasks' states after the call.
        """
        async with self.db.transaction() as tx:
            row, clock = await tx.read(one("scan_lock_for_orchestration", {"scan_id": scan_id}),
                                       one("clock_now", {"now": self.clock()}))
            if row is None or (organization_id is not None and row.organization_id != organization_id):
                raise NotFound("no such scan", scan_id=str(scan_id))
            version, head_hash, status, cancel_requested, now = (row.version, row.head_hash, row.status,
                                                                 row.cancel_requested, clock.now)
            events: list[DomainEvent] = [*scan_rules.request_cancel(
                scan_id, version, status, cancel_requested, reason=reason, now=now, actor=actor)]
            head = tx.append(StreamHead(scan_id, version, bytes(head_hash)), events)
            if events and not await tx.all("scan_open_tasks", {"scan_id": scan_id}):
                # Nothing left to end (no job yet, or every job ended): the scan ends now.
                finished = scan_rules.finish_scan(scan_id, head.version, "cancelled", now=now, actor=actor)
                tx.append(head, [finished])
                notify_scan_finished(tx, row.organization_id, scan_id, "cancelled", now)
                events = [*events, finished]
            await tx.commit()
        self.observe(events)
        async with self.db.read() as reader:
            task_ids = [task.id for task in await reader.all("scan_open_tasks", {"scan_id": scan_id})]
        return [await self.tasks.request_cancel(task_id, reason=reason, actor=actor) for task_id in task_ids]
