"""Worker writes are ordered against revocation: a worker streams result batches, progress and
renewals over its own connections while an operator revokes its assignment over another; no
batch, start, renewal or completion of the task is ordered (by transaction, then notification
id: the log's global order) after the revocation event. Many rounds, each a fresh race."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from leasehold.domain.results import payload_sha256
from support.gateway import RunningGateway, WorkerClient

ROUNDS = 30
#: Events that take the worker's word: none may come after the revocation.
TAKEN = ("ResultBatchAccepted", "TaskStarted", "LeaseRenewed", "TaskCompleted", "AttemptFailed")


async def stream_batches(worker: WorkerClient, lease: dict[str, Any], refused: list[int]) -> None:
    for seq in range(1, 200):
        records = [{"type": "raw", "n": seq}]
        final = seq % 7 == 0
        reply = await worker.write(lease, "results", sequence_number=seq, idempotency_key=f"k{seq}",
                                   payload_sha256=payload_sha256(records), payload=records, final=final)
        if reply.status != 200:
            refused.append(reply.status)
            return
        if final:
            reply = await worker.write(lease, "complete")
            refused.append(reply.status)
            return


async def keep_saying_progress(worker: WorkerClient, lease: dict[str, Any], refused: list[int]) -> None:
    for n in range(200):
        reply = await worker.write(lease, "renew" if n % 2 else "progress")
        if reply.status != 200 or reply.body.get("cancel_requested"):
            refused.append(reply.status)
            return


@pytest.mark.parametrize(("revoked", "rounds"), [("assignment", ROUNDS), ("worker", ROUNDS // 3)])
async def test_no_taken_write_is_ordered_after_the_revocation(gateway: RunningGateway, revoked: str,
                                                              rounds: int) -> None:
    shared = await gateway.worker(capacity=rounds + 1, limit=8)
    rng = random.Random(16)
    raced = 0
    for _ in range(rounds):
        org = await gateway.registry.create_organization(f"o-{rng.random()}")
        # A worker revocation is for good: a worker per round then.
        worker = await gateway.worker(org=org, limit=8) if revoked == "worker" else shared
        if revoked == "assignment":
            await gateway.registry.assign_worker(worker.id, org)
        task = await gateway.task(scan=await gateway.scans.create_scan(org, {}))
        lease = (await worker.acquire()).body["lease"]
        assert lease["task"]["id"] == str(task)
        refused: list[int] = []
        writers = [asyncio.create_task(stream_batches(worker, lease, refused)),
                   asyncio.create_task(keep_saying_progress(worker, lease, refused))]
        await asyncio.sleep(rng.uniform(0.0, 0.01))  # a random point of the writes for the revocation: the race
        path = (f"/v1/workers/{worker.id}/assignments/{org}/revoke" if revoked == "assignment"
                else f"/v1/workers/{worker.id}/revoke")
        reply = await gateway.operator("POST", path, {"reason": "race"})
        assert reply.status == 200, reply.body
        await asyncio.gather(*writers)
        raced += 403 in refused

        revocation = await gateway.count(
            "SELECT array[transaction_id::text::numeric, notification_id] FROM events"
            " WHERE originator_id = %s AND topic LIKE %s ORDER BY notification_id DESC LIMIT 1",
            worker.id, "%AssignmentChanged" if revoked == "assignment" else "%WorkerRevoked")
        async with gateway.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT split_part(topic, ':', 2), transaction_id::text::numeric, notification_id FROM events"
                " WHERE originator_id = %s ORDER BY transaction_id, notification_id", (task,))
            task_events = await cur.fetchall()
        late = [name for name, xid, nid in task_events
                if name in TAKEN and (xid, nid) > tuple(revocation)]
        assert not late, (late, task_events, revocation)
        late_by_id = [name for name, _, nid in task_events if name in TAKEN and nid > revocation[1]]
        assert not late_by_id, late_by_id
    # The race was run, not dodged: in some rounds writes reached the Gateway after the
    # revocation (and were refused).
    print(f"{revoked}: {raced} of {rounds} rounds had writes refused after the revocation")
    assert raced > 0, raced
