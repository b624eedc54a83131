"""Legacy-executed scans: their progress as the legacy side reports it, and moving a queued
legacy scan to the Gateway (what ``leasehold legacy drain`` does with each queue message).

RFC "Data migration and compatibility": a scan runs in one mode only. A legacy scan id keys at
most one Gateway scan and at most one legacy record (partial unique indexes on
``scans.legacy_scan_id``). :meth:`LegacyScans.convert` turns one legacy message into a Gateway
scan in one transaction, and refuses when the scan has already started in either mode:

* a Gateway scan made from the same message (same sha256) and still ``pending`` (or, when the
  message is re-handled after a crash, in any state): already converted, nothing to do;
* any other Gateway scan for that legacy id: refused (it runs, ran, or came from another message);
* a legacy record that is not ``pending`` (the legacy side reported it running or finished):
  refused; a ``pending`` one is handed over (``ScanHandedOver``: it and its jobs end
  ``cancelled``, pointing at the new Gateway scan) in the same transaction;
* flags that make the scan legacy-executed: refused (turn the organisation's or the profile's
  ``gateway_execution`` on first).

An unknown organisation or profile, or bad steps, raise :class:`domain.errors.NotFound` /
:class:`domain.errors.InvalidRequest`: the message is invalid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal
from uuid import UUID, uuid4

from leasehold.domain import scan as scan_rules
from leasehold.domain.errors import Conflict, NotFound
from leasehold.domain.events import ScanStatus
from leasehold.domain.legacy import LegacyMessage
from leasehold.domain.profiles import LegacyExecuted
from leasehold.gateway.commands.scans import open_scan
from leasehold.gateway.commands.webhooks import notify_scan_finished
from leasehold.persistence.event_log import StreamHead
from leasehold.persistence.transaction import Clock, Database, one, system_clock

DRAIN_ACTOR = "legacy-drain"

Outcome = Literal["converted", "already_converted", "refused"]


@dataclass(frozen=True, slots=True)
class Conversion:
    """What became of one legacy message (``scan_id``: the Gateway scan, when there is one)."""

    outcome: Outcome
    reason: str
    scan_id: UUID | None = None
    handed_over: UUID | None = None  # the legacy record retired in favour of ``scan_id``


class _RolledBack(Exception):
    """Ends a dry run's transaction (rolled back) carrying what it would have done."""

    def __init__(self, conversion: Conversion) -> None:
        super().__init__(conversion.reason)
        self.conversion = conversion


class LegacyScans:
    def __init__(self, db: Database, *, clock: Clock = system_clock,
                 new_id: Callable[[], UUID] = uuid4) -> None:
        self.db, self.clock, self.new_id = db, clock, new_id

    async def record_status(self, scan_id: UUID, status: ScanStatus, *, organization_id: UUID | None = None,
                            actor: str = "system") -> None:
        """The legacy side says how its scan is doing (``running``, then its outcome)."""
        async with self.db.transaction() as tx:
            row, clock = await tx.read(one("scan_lock", {"scan_id": scan_id}), one("clock_now", {"now": self.clock()}))
            if row is None or (organization_id is not None and row.organization_id != organization_id):
                raise NotFound("no such scan", scan_id=str(scan_id))
            events = scan_rules.record_legacy_status(scan_id, row.version, row.execution_mode, row.status, status,
                                                     now=clock.now, actor=actor)
            tx.append(StreamHead(scan_id, row.version, bytes(row.head_hash)), events)
            if events and status in scan_rules.TERMINAL_SCAN_STATUSES:
                notify_scan_finished(tx, row.organization_id, scan_id, status, clock.now)
            await tx.commit()

    async def convert(self, message: LegacyMessage, *, recovering: bool = False, dry_run: bool = False,
                      actor: str = DRAIN_ACTOR) -> Conversion:
        """Make the Gateway scan of ``message`` (or say why not); ``recovering``: the message was
        found in the processing list, so a previous run may have converted it already. A dry run
        decides the same way and rolls back."""
        try:
            try:
                return await self._convert(message, recovering, dry_run, actor)
            except Conflict as exc:
                if isinstance(exc, LegacyExecuted) or exc.details.get("constraint") != "scans_legacy_gateway_idx":
                    raise
                # Another transaction made a Gateway scan for this legacy id meanwhile: look again.
                return await self._convert(message, recovering, dry_run, actor)
        except LegacyExecuted as exc:
            return Conversion("refused", exc.message)
        except _RolledBack as done:
            return done.conversion

    async def _convert(self, m: LegacyMessage, recovering: bool, dry_run: bool, actor: str) -> Conversion:
        async with self.db.transaction() as tx:
            found = {row.execution_mode: row for row in await tx.all("scans_lock_by_legacy_id",
                                                         {"legacy_scan_id": m.legacy_scan_id,
                                                          "organization_id": m.organization_id})}
            if "gateway" in found:
                mine = found["gateway"]
                scan_id, status, sha256 = mine.id, mine.status, mine.legacy_message_sha256
                if sha256 == m.sha256 and (recovering or status == "pending"):
                    return Conversion("already_converted", f"already converted to Gateway scan {scan_id}", scan_id)
                if status == "pending":
                    return Conversion("refused", f"Gateway scan {scan_id} was already made for it (from another "
                                                 "message or request)", scan_id)
                return Conversion("refused", _started(status, "Gateway", scan_id), scan_id)
            legacy = found.get("legacy")
            if legacy is not None and legacy.status != "pending":
                return Conversion("refused", _started(legacy.status, "legacy", legacy.id))
            opened = await open_scan(
                tx, self.new_id(), m.organization_id, m.targets, clock=self.clock(), actor=actor,
                new_id=self.new_id, execution_mode_wanted="gateway", steps=m.steps, profile_name=m.profile_name,
                legacy_scan_id=m.legacy_scan_id, legacy_message_sha256=m.sha256)
            handed_over = None
            if legacy is not None:
                handed_over, status, version, head_hash = legacy.id, legacy.status, legacy.version, legacy.head_hash
                job_ids = [job.id for job in await tx.all("scan_job_ids", {"scan_id": handed_over})]
                event = scan_rules.hand_over(handed_over, version, "legacy", status, gateway_scan_id=opened.id,
                                             job_ids=job_ids, now=opened.now, actor=actor)
                tx.append(StreamHead(handed_over, version, bytes(head_hash)), [event])
            done = Conversion("converted", f"Gateway scan {opened.id}"
                              + (f" (legacy record {handed_over} handed over)" if handed_over else ""),
                              opened.id, handed_over)
            if dry_run:
                raise _RolledBack(done)
            await tx.commit()
        return done


def _started(status: str, mode: str, scan_id: UUID) -> str:
    if status == "running":
        return f"already running in {mode} mode (scan {scan_id})"
    return f"already {status} in {mode} mode (scan {scan_id})"
