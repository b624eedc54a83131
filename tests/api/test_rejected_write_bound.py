"""A worker replaying wrong-token writes cannot grow the event log without bound: each refusal
answers 409, the first MAX_RECORDED_REJECTIONS of an attempt are recorded as WriteRejected
events, the rest only counted (rejected_write_counts)."""

from __future__ import annotations

import asyncio

from leasehold.gateway.commands.lifecycle import MAX_RECORDED_REJECTIONS
from support.gateway import RunningGateway

WRONG = "wrong-token-" + "x" * 30


async def test_300_wrong_token_writes_record_a_bounded_number_of_events(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    await gateway.task()
    lease = (await worker.acquire()).body["lease"]
    forged = {**lease, "lease_token": WRONG}
    before = await gateway.count("SELECT count(*) FROM events")
    statuses: list[int] = []

    async def replay(n: int) -> None:
        for _ in range(n):
            statuses.append((await worker.write(forged, "progress" if len(statuses) % 2 else "renew")).status)

    await asyncio.gather(*(replay(30) for _ in range(10)))  # 300, ten at a time
    assert statuses == [409] * 300
    recorded = await gateway.count(
        "SELECT count(*) FROM events WHERE topic LIKE %s AND originator_id = %s", "%WriteRejected", lease["task"]["id"])
    assert recorded == MAX_RECORDED_REJECTIONS
    assert await gateway.count("SELECT count(*) FROM events") == before + MAX_RECORDED_REJECTIONS
    assert await gateway.count("SELECT array[recorded, unrecorded] FROM rejected_write_counts WHERE attempt_id = %s",
                               lease["attempt_id"]) == [MAX_RECORDED_REJECTIONS, 300 - MAX_RECORDED_REJECTIONS]
    # The attempt itself is untouched: its real token still works.
    assert (await worker.write(lease, "progress")).status == 200
