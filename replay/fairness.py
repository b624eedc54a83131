"""Fair shares from the log: the state acquisition keeps in ``org_service``, re-derived.

``org_service`` is not a projection (every task stream of an organisation writes its row, under
the row's lock), but each lease event records what decided it (:class:`domain.events.FairShareGrant`:
the eligible organisations with their virtual times, the tag, the organisation's virtual time
after the lease), so the state follows from the log: an organisation's virtual time is the one
its last recorded lease left, its leases served are its recorded leases, its live attempts are
its leases minus its attempts that ended, its total wait the sum of its recorded waits.
:func:`fair_share_differences` compares that with the live rows, in one snapshot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from leasehold.domain import events as ev
from leasehold.domain import fairness
from leasehold.persistence.codec import decode_event, topic_of
from leasehold.persistence.event_log import event_batches
from leasehold.persistence.snapshot import snapshot
from leasehold.persistence.tables import fair_share_rows

#: The events that move an organisation's fair-share state (and the one naming a task's organisation).
_MOVERS: tuple[type[ev.DomainEvent], ...] = (ev.TaskCreated, ev.TaskLeased, *fairness.ATTEMPT_ENDING_EVENTS)
RELEVANT = frozenset(topic_of(cls) for cls in _MOVERS)


@dataclass(slots=True)
class OrganizationShare:
    virtual_time: float = 0.0
    served: int = 0
    live: int = 0
    waited_seconds: float = 0.0

    def as_tuple(self) -> tuple[float, int, int, float]:
        return (self.virtual_time, self.served, self.live, self.waited_seconds)


async def fair_share_state(conn: AsyncConnection[Any]) -> dict[UUID, OrganizationShare]:
    """Every organisation's fair-share state as the log visible to ``conn``'s transaction says."""
    organization_of: dict[UUID, UUID] = {}
    state: dict[UUID, OrganizationShare] = {}
    async for batch in event_batches(conn):
        for oid, version, topic, raw, _hash in batch:
            if topic not in RELEVANT:
                continue
            event = decode_event(oid, version, topic, raw)
            if isinstance(event, ev.TaskCreated):
                organization_of[event.originator_id] = event.organization_id
                continue
            org = organization_of.get(event.originator_id)
            if org is None:
                continue
            share = state.setdefault(org, OrganizationShare())
            if isinstance(event, ev.TaskLeased):
                share.live += 1
                if event.fair_share is not None:
                    share.virtual_time = event.fair_share.virtual_time
                    share.served += 1
                    share.waited_seconds += event.fair_share.waited_seconds
            elif fairness.ends_attempt(event):
                share.live -= 1
    return state


async def fair_share_differences(conn: AsyncConnection[Any]) -> list[str]:
    """Where ``org_service`` disagrees with the log (empty: they agree), read in one snapshot."""
    async with snapshot(conn):
        derived = await fair_share_state(conn)
        live = await fair_share_rows(conn)
    problems = []
    for org in sorted(set(derived) | set(live), key=str):
        want = derived.get(org, OrganizationShare()).as_tuple()
        have = live.get(org, (0.0, 0, 0, 0.0))
        same = (math.isclose(want[0], have[0], abs_tol=1e-9) and want[1:3] == tuple(have[1:3])
                and math.isclose(want[3], have[3], rel_tol=1e-9, abs_tol=1e-6))
        if not same:
            problems.append(f"organisation {org}: the log says (virtual_time, served, live, waited_seconds) = "
                            f"{want}, org_service holds {have}")
    return problems
