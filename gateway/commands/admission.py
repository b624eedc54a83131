"""Admission checks inside a creating transaction (rules: :mod:`domain.admission`).

Only an organisation with a cap pays for it: its creators of one kind take turns on a
transaction-scoped advisory lock keyed on the organisation and the kind, then count what is
queued in a statement of their own (READ COMMITTED: it sees every creation committed by an
earlier holder), and decide. The lock is released at COMMIT, so concurrent creators never pass
the cap. Scan creation reads the cap under the organisation's row lock (``FOR SHARE``; setting
the caps takes it ``FOR UPDATE``, so it waits for scans being created, and every scan created
after it commits sees the new cap). Task creation reads the cap with the scan's lock, without
the organisation's row lock (the hot path): a task being created while a cap is first set may
still be admitted against no cap.
"""

from __future__ import annotations

from uuid import UUID

from leasehold.domain import admission as rules
from leasehold.persistence.transaction import Transaction, one

__all__ = ["admit"]


async def admit(tx: Transaction, kind: rules.Kind, organization_id: UUID, cap: int | None) -> None:
    """Raise :class:`domain.admission.AdmissionRefused` when one more ``kind`` would pass ``cap``
    (nothing is read when there is no cap). Call before anything is written."""
    if cap is None:
        return
    params = {"organization_id": organization_id, "kind": kind}
    _, counted = await tx.read(one("admission_serialize", params),
                               one("admission_queued_tasks" if kind == "task" else "admission_queued_scans", params))
    rules.admit(kind, organization_id, counted.queued, cap)
