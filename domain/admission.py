"""Admission: a per-organisation cap on queued work, so one organisation cannot flood the queue.

An organisation may have two caps (None: no cap, the default), set by an operator with a reason
(``OrganizationAdmissionSet``, as absolute values):

* ``max_queued_tasks``: tasks *queued*, that is waiting to be leased: state ``pending`` or
  ``retry_wait``. A task leased or running is no longer queued; a task back to ``retry_wait`` is
  queued again (a retry is never refused: it is not a creation).
* ``max_queued_scans``: Gateway-executed scans *queued*, that is not started yet: status
  ``pending`` (a scan starts with the first lease of one of its tasks, or ends first). A scan
  running is no longer queued: the fleet's capacity and the fair-share caps bound those.

Creating a task (``POST /v1/scans/{id}/tasks``) is refused when the organisation already has
``max_queued_tasks`` tasks queued; creating a scan (the API, a stored profile's run, a
schedule's run, a legacy conversion) when it already has ``max_queued_scans`` scans queued. A refusal
changes nothing. The first task a new scan's profile queues belongs to the scan's admission, and
the later steps of a scan already admitted are never refused: they may take the queued tasks
past the cap, never a creation request. Lowering a cap below what is queued ends nothing; it
refuses new work until enough has left the queue.

The Gateway decides inside the creating transaction, after it has serialised the organisation's
creators (see ``gateway.commands.admission``), so concurrent creators never exceed a cap.

Pure: no I/O.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from leasehold.domain.errors import InvalidRequest, LeaseholdError
from leasehold.domain.events import OrganizationAdmissionSet

__all__ = ["MAX_CAP", "MAX_REASON", "RETRY_AFTER_SECONDS", "AdmissionRefused", "Kind", "admit", "set_admission"]

Kind = Literal["task", "scan"]

#: The largest cap (the column's CHECK agrees).
MAX_CAP = 1_000_000
#: The longest reason recorded.
MAX_REASON = 500
#: The Retry-After of a refusal: a fixed estimate of when queued work will have moved on (the
#: queue drains at the pace of the organisation's workers, which the Gateway does not predict).
RETRY_AFTER_SECONDS = 30


class AdmissionRefused(LeaseholdError):
    """The organisation has as much queued work as its admission cap allows; retry later."""

    status = 429
    code = "admission-refused"


def validate_cap(name: str, cap: int | None) -> None:
    if cap is not None and not 0 <= cap <= MAX_CAP:
        raise InvalidRequest(f"{name} must be between 0 and {MAX_CAP}, or null (no cap)")


def set_admission(organization_id: UUID, version: int, current: tuple[int | None, int | None],
                  max_queued_tasks: int | None, max_queued_scans: int | None, *, reason: str, now: datetime,
                  actor: str) -> list[OrganizationAdmissionSet]:
    """The organisation's caps (absolute values); nothing when they are already so."""
    validate_cap("max_queued_tasks", max_queued_tasks)
    validate_cap("max_queued_scans", max_queued_scans)
    reason = reason.strip()
    if not reason or len(reason) > MAX_REASON:
        raise InvalidRequest(f"a reason is required (at most {MAX_REASON} characters)")
    if current == (max_queued_tasks, max_queued_scans):
        return []
    return [OrganizationAdmissionSet(originator_id=organization_id, originator_version=version + 1, timestamp=now,
                                     actor=actor, max_queued_tasks=max_queued_tasks,
                                     max_queued_scans=max_queued_scans, reason=reason)]


def admit(kind: Kind, organization_id: UUID, queued: int, cap: int | None) -> None:
    """Admit one more ``kind`` of the organisation, which has ``queued`` of them queued, or raise
    :class:`AdmissionRefused` (429, with a Retry-After) when that would pass ``cap``."""
    if cap is not None and queued + 1 > cap:
        noun = "tasks queued" if kind == "task" else "scans queued (not started)"
        raise AdmissionRefused(f"the organisation has {queued} {noun}, its admission cap is {cap}; "
                               f"retry later", organization_id=str(organization_id), kind=kind, queued=queued,
                               cap=cap, retry_after=RETRY_AFTER_SECONDS)
