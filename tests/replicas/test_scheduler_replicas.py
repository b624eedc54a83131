"""Three Gateway processes run the scheduler against one database; a schedule is due every
second; Gateways are SIGKILLed and started again during the run. Every slot of the window
gets exactly one scan, and no slot is missed except as the misfire policy says (``run_once``:
a claim that comes a full period late makes one scan for the slots it covers).

The same claim is raced in-process over 1,000 slots of an injected clock in
``tests/core/test_schedules.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from replicas_support import Cluster

from leasehold.persistence.chain import verify_chains
from leasehold.persistence.connection import connect
from support.waits import wait_until

PERIOD = timedelta(seconds=1)


async def schedule_events(c: Cluster, schedule_id: UUID) -> list[dict[str, Any]]:
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT split_part(topic, ':', 2), convert_from(state, 'UTF8')::jsonb FROM events"
            " WHERE originator_id = %s ORDER BY originator_version", (schedule_id,))
        return [{"type": t, **state} for t, state in await cur.fetchall()]


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


@pytest.mark.slow
async def test_one_scan_per_slot_across_killed_gateways(database_url: str,
                                                        cluster: Callable[..., Awaitable[Cluster]]) -> None:
    c = await cluster(database_url, 3, schedule_interval_seconds=0.2)
    reply = await c.views[0].operator("POST", "/v1/schedules", {
        "organization_id": str(c.org), "name": "every second", "interval_seconds": 1,
        "targets": {"targets": ["127.0.0.1"]}, "profile": [{"task_type": "probe"}]})
    assert reply.status == 201, reply.body
    schedule_id = UUID(reply.body["id"])

    async def fired(n: int) -> bool:
        return sum(e["type"] == "ScheduleFired" for e in await schedule_events(c, schedule_id)) >= n

    kills: list[tuple[str, float]] = []
    # One Gateway killed and started again, then two at once (one keeps running throughout).
    for victims in ([1], [0, 2]):
        await wait_until(lambda: fired(len(kills) * 2 + 4), 30, what="the schedule fires")
        for i in victims:
            await c.gateways[i].kill()
            kills.append((f"gateway {i} killed", time.time()))
        await asyncio.gather(*(c.gateways[i].start() for i in victims))
        kills.append(("started again", time.time()))
    # At least 15 slots, and three after the last restart (a slow restart must not end the window).
    so_far = sum(e["type"] == "ScheduleFired" for e in await schedule_events(c, schedule_id))
    await wait_until(lambda: fired(max(15, so_far + 3)), 40, what="15 slots fired, 3 after the restarts")
    reply = await c.views[2].operator("POST", f"/v1/schedules/{schedule_id}/pause")
    assert reply.status in (200, 204), reply.body

    events = await schedule_events(c, schedule_id)
    created, fires = events[0], [e for e in events if e["type"] == "ScheduleFired"]
    assert created["type"] == "ScheduleCreated" and events[-1]["type"] == "ScheduleEnabledChanged"
    assert not any(e["type"] == "ScheduleSkipped" for e in events)  # run_once never skips
    slots = [ts(e["slot"]) for e in fires]
    # No duplicate, and the slots chain: each claim's next slot is the next claim's slot.
    assert len(set(slots)) == len(slots)
    assert slots[0] == ts(created["next_run_at"])
    for before, after in zip(fires, fires[1:], strict=False):
        assert ts(after["slot"]) == ts(before["next_run_at"])
    # A slot is covered by an earlier one only when that claim was a full period late.
    collapsed = 0
    for e in fires:
        claimed, nxt = ts(e["timestamp"]), ts(e["next_run_at"])
        assert ts(e["slot"]) <= claimed < nxt <= claimed + PERIOD
        collapsed += round((nxt - ts(e["slot"])) / PERIOD) - 1
    # The kills happened inside the window.
    assert all(slots[0].timestamp() < at < slots[-1].timestamp() for _, at in kills)
    print(f"{len(fires)} scans over {len(fires) + collapsed} slots ({collapsed} collapsed by run_once); "
          f"events: {kills}")

    # Exactly one scan per fired slot, each with its one task, and nothing else from this schedule.
    scans = [UUID(e["scan_id"]) for e in fires]
    assert len(set(scans)) == len(scans)
    assert await c.scalar("SELECT count(*) FROM scans WHERE id = ANY(%s)", scans) == len(scans)
    assert await c.scalar("SELECT count(*) FROM worker_tasks WHERE scan_id = ANY(%s)", scans) == len(scans)
    assert await c.scalar("SELECT count(*) FROM scans WHERE organization_id = %s", c.org) == len(scans) + 1
    async with await connect(c.url) as conn:
        assert await verify_chains(conn) == []
