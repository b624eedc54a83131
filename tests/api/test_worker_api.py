"""The worker API over real HTTPS with mTLS against a real Gateway and PostgreSQL."""

from __future__ import annotations

import asyncio
import time

from leasehold.domain.results import payload_sha256
from support.gateway import RunningGateway


async def test_full_lifecycle_over_https(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    task_id = await gateway.task(scope={"targets": ["127.0.0.1"]})
    r = await worker.acquire()
    assert r.status == 200, r.body
    lease = r.body["lease"]
    assert lease["task"]["id"] == str(task_id) and lease["task"]["scope"] == {"targets": ["127.0.0.1"]}
    assert {"attempt_id", "lease_token", "lease_expires_at", "deadline_at"} <= set(lease)
    r = await worker.write(lease, "progress")
    assert r.status == 200 and r.body["task"]["state"] == "running" and r.body["attempt"]["status"] == "running"
    r = await worker.write(lease, "renew")
    assert r.status == 200 and r.body["cancel_requested"] is False
    r = await worker.final_batch(lease)
    assert r.status == 200 and r.body["duplicate"] is False, r.body
    r = await worker.write(lease, "complete")
    assert r.status == 200 and r.body["task"]["state"] == "completed"
    assert r.body["attempt"]["status"] == "succeeded"


async def test_complete_can_carry_the_final_batch(gateway: RunningGateway) -> None:
    """Two requests a task: acquire, then complete with the final batch (submitted and completed
    in one transaction); repeating it answers the same, and a malformed batch is a 422."""
    worker = await gateway.worker()
    await gateway.task()
    lease = (await worker.acquire()).body["lease"]
    records = [{"type": "asset", "kind": "host", "value": "10.9.9.9"}]
    batch = {"sequence_number": 1, "idempotency_key": "last", "payload_sha256": payload_sha256(records),
             "payload": records}
    bad = await worker.write(lease, "complete", final_batch={**batch, "sequence_number": 0})
    assert bad.status == 422 and bad.headers["Content-Type"].startswith("application/problem+json")
    r = await worker.write(lease, "complete", final_batch=batch)
    assert r.status == 200, r.body
    assert r.body["task"]["state"] == "completed" and r.body["attempt"]["status"] == "succeeded"
    again = await worker.write(lease, "complete", final_batch=batch)
    assert again.status == 200 and again.body == r.body
    assert await gateway.count("SELECT count(*) FROM worker_result_batches WHERE final") == 1


async def test_acquire_with_nothing_to_do_answers_204(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    assert (await worker.acquire()).status == 204


async def test_long_poll_wakes_when_a_task_is_created(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    waiting = asyncio.create_task(worker.acquire(wait=10))
    await gateway.long_polls_waiting()
    created_at = time.perf_counter()
    task_id = await gateway.task()
    r = await waiting
    elapsed = time.perf_counter() - created_at
    assert r.status == 200 and r.body["lease"]["task"]["id"] == str(task_id)
    # Woken by NOTIFY, not by the 1 s poll; loose bound (the benchmark measures the real number).
    assert elapsed < 0.5, elapsed


async def test_long_poll_answers_a_cancellation_of_a_running_task(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    await gateway.task()
    lease = (await worker.acquire()).body["lease"]
    await worker.write(lease, "progress")
    waiting = asyncio.create_task(worker.acquire(wait=10))
    await gateway.long_polls_waiting()
    await gateway.lifecycle.request_cancel(gateway_task_id(lease))
    r = await asyncio.wait_for(waiting, 2)
    assert r.status == 200 and r.body["lease"] is None
    assert r.body["cancel_requested"] == [{"task_id": lease["task"]["id"], "attempt_id": lease["attempt_id"]}]
    r = await worker.write(lease, "renew")
    assert r.status == 200 and r.body["cancel_requested"] is True
    r = await worker.write(lease, "cancel-ack")
    assert r.status == 200 and r.body["task"]["state"] == "cancelled"


def gateway_task_id(lease: dict) -> object:
    from uuid import UUID

    return UUID(lease["task"]["id"])


async def test_known_cancellations_do_not_end_the_long_poll_again(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    await gateway.task()
    lease = (await worker.acquire()).body["lease"]
    await gateway.lifecycle.request_cancel(gateway_task_id(lease))
    first = await worker.acquire()
    assert first.status == 200 and first.body["cancel_requested"][0]["attempt_id"] == lease["attempt_id"]
    # The worker says it already knows: the acquire waits (here: nothing else comes, so 204).
    started = time.perf_counter()
    again = await worker.acquire(wait=1, known_cancels=[lease["attempt_id"]])
    assert again.status == 204 and time.perf_counter() - started >= 0.9


async def test_long_poll_wakes_when_disabling_a_worker_frees_its_task(gateway: RunningGateway) -> None:
    disabled, other = await gateway.worker(), await gateway.worker()
    await gateway.task()
    lease = (await disabled.acquire()).body["lease"]
    waiting = asyncio.create_task(other.acquire(wait=10))
    await gateway.long_polls_waiting()
    started = time.perf_counter()
    reply = await gateway.operator("POST", f"/v1/workers/{disabled.id}/disable")
    assert reply.status == 200, reply.body
    r = await waiting
    elapsed = time.perf_counter() - started
    assert r.status == 200 and r.body["lease"]["task"]["id"] == lease["task"]["id"]
    assert r.body["lease"]["attempt_id"] != lease["attempt_id"]
    # Woken by NOTIFY when the attempt was ended, not by the 1 s poll.
    assert elapsed < 0.5, elapsed
    refused = await disabled.write(lease, "renew")
    assert refused.status == 403 and refused.headers["Content-Type"].startswith("application/problem+json")
