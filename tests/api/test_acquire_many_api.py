"""Several leases per request over the worker API (real HTTPS with mTLS, a real Gateway and
PostgreSQL): ``max_tasks`` on acquire, the next acquire carried by a completion or a failure,
and requests without the new fields answered exactly as before."""

from __future__ import annotations

import asyncio
from typing import Any

from leasehold.domain.results import payload_sha256
from support.gateway import RunningGateway, WorkerClient

#: The keys of a one-task acquire's answer and of a completion's, as they always were.
V1_ACQUIRE_KEYS = {"lease", "cancel_requested"}
V1_WRITE_KEYS = {"task", "attempt"}


def _batch(key: str = "last") -> dict[str, Any]:
    records = [{"type": "raw", "n": 1}]
    return {"sequence_number": 1, "idempotency_key": key, "payload_sha256": payload_sha256(records),
            "payload": records}


async def test_max_tasks_leases_several_and_lists_them(gateway: RunningGateway) -> None:
    tasks = {str(await gateway.task()) for _ in range(5)}
    worker = await gateway.worker(capacity=3)
    r = await worker.acquire(max_tasks=8)
    assert r.status == 200, r.body
    assert set(r.body) == {"lease", "cancel_requested", "leases"}
    leases = r.body["leases"]
    assert len(leases) == 3  # its capacity, not the eight asked
    assert r.body["lease"] == leases[0]
    assert {lease["task"]["id"] for lease in leases} <= tasks
    assert len({lease["lease_token"] for lease in leases}) == 3
    for lease in leases:  # every lease is a lease of its own: each completes on its own token
        done = await worker.write(lease, "complete", final_batch=_batch())
        assert done.status == 200 and done.body["task"]["state"] == "completed"
    assert set(done.body) == V1_WRITE_KEYS


async def test_a_request_without_the_new_fields_is_answered_as_before(gateway: RunningGateway) -> None:
    await gateway.task()
    await gateway.task()
    worker = await gateway.worker(capacity=4)
    r = await worker.acquire(request_id="v1")
    assert r.status == 200 and set(r.body) == V1_ACQUIRE_KEYS
    assert set(r.body["lease"]) == {"task", "attempt", "attempt_id", "lease_token", "lease_expires_at",
                                    "deadline_at", "target_policy"}
    done = await worker.write(r.body["lease"], "complete", final_batch=_batch())
    assert done.status == 200 and set(done.body) == V1_WRITE_KEYS
    r = await worker.acquire()
    failed = await worker.write(r.body["lease"], "fail", error="boom", retryable=False)
    assert failed.status == 200 and set(failed.body) == V1_WRITE_KEYS
    # Nothing left: 204 as always, whether or not max_tasks is set.
    assert (await worker.acquire()).status == 204
    assert (await worker.acquire(max_tasks=4)).status == 204


async def test_a_repeated_request_id_returns_the_same_leases(gateway: RunningGateway) -> None:
    for _ in range(6):
        await gateway.task()
    worker = await gateway.worker(capacity=6)
    first = await worker.acquire(max_tasks=3, request_id="same")
    again = await worker.acquire(max_tasks=3, request_id="same")
    assert first.status == again.status == 200
    ids = [lease["attempt_id"] for lease in first.body["leases"]]
    assert len(ids) == 3 and [lease["attempt_id"] for lease in again.body["leases"]] == ids
    assert not {lease["lease_token"] for lease in again.body["leases"]} & {
        lease["lease_token"] for lease in first.body["leases"]}
    assert await gateway.count("SELECT count(*) FROM worker_task_attempts") == 3


async def test_bad_max_tasks_is_refused_and_changes_nothing(gateway: RunningGateway) -> None:
    await gateway.task()
    worker = await gateway.worker()
    for body in ({"max_tasks": 0}, {"max_tasks": 33}, {"max_tasks": "2"}, {"max_tasks": 2.5},
                 {"max_tasks": 2, "request_id": "r" * 197}):
        r = await worker.acquire(**body)
        assert r.status == 422, (body, r.status)
        assert r.headers["Content-Type"].startswith("application/problem+json")
    lease = (await worker.acquire()).body["lease"]
    bad = await worker.write(lease, "complete", final_batch=_batch(), acquire={"max_tasks": 0})
    assert bad.status == 422
    assert await gateway.count("SELECT count(*) FROM worker_task_attempts") == 1
    assert await gateway.count("SELECT count(*) FROM worker_tasks WHERE state = 'completed'") == 0


async def test_complete_carries_the_next_acquire(gateway: RunningGateway) -> None:
    for _ in range(4):
        await gateway.task()
    worker = await gateway.worker(capacity=2)
    lease = (await worker.acquire()).body["lease"]
    r = await worker.write(lease, "complete", final_batch=_batch(),
                           acquire={"max_tasks": 2, "request_id": "next-1"})
    assert r.status == 200, r.body
    assert r.body["task"]["state"] == "completed" and set(r.body) == V1_WRITE_KEYS | {"leases"}
    # Granted after the completion committed: its slot counts as free, so two leases.
    nxt = r.body["leases"]
    assert len(nxt) == 2 and lease["task"]["id"] not in {n["task"]["id"] for n in nxt}
    # The completion repeated (its answer lost): the same attempts come back, no more are leased.
    again = await worker.write(lease, "complete", final_batch=_batch(),
                               acquire={"max_tasks": 2, "request_id": "next-1"})
    assert again.status == 200 and [n["attempt_id"] for n in again.body["leases"]] == [n["attempt_id"] for n in nxt]
    assert await gateway.count("SELECT count(*) FROM worker_task_attempts") == 3
    # A failure carries it too; at capacity it grants nothing, and the failure is still reported.
    current = again.body["leases"]  # (the repeat's tokens replaced the first answer's)
    failed = await worker.write(current[0], "fail", error="boom", retryable=False, acquire={"max_tasks": 1})
    assert failed.status == 200 and failed.body["task"]["state"] == "failed_terminal"
    assert len(failed.body["leases"]) == 1  # the slot it freed
    full = await worker.write(current[1], "complete", final_batch=_batch(),
                              acquire={"max_tasks": 1})
    assert full.status == 200 and full.body["task"]["state"] == "completed"
    assert full.body["leases"] == []  # the four tasks are all leased or ended: nothing left to grant
    assert await gateway.count("SELECT count(*) FROM worker_tasks WHERE state = 'pending'") == 0


async def test_a_failing_carried_acquire_still_reports_the_completion(gateway: RunningGateway) -> None:
    """The carried acquire's request id names leases that ended already (it is refused on its
    own): the completion is done and answered, with no leases."""
    for _ in range(3):
        await gateway.task()
    worker = await gateway.worker(capacity=3)
    first = (await worker.acquire(request_id="used")).body["lease"]
    await worker.write(first, "fail", error="x", retryable=False)
    lease = (await worker.acquire()).body["lease"]
    r = await worker.write(lease, "complete", final_batch=_batch(), acquire={"request_id": "used"})
    assert r.status == 200 and r.body["task"]["state"] == "completed" and r.body["leases"] == []


async def test_the_long_poll_answers_at_the_first_lease(gateway: RunningGateway) -> None:
    worker = await gateway.worker(capacity=4)
    waiting = asyncio.create_task(worker.acquire(wait=10, max_tasks=4))
    await gateway.long_polls_waiting()
    await gateway.task()
    r = await asyncio.wait_for(waiting, 10)
    assert r.status == 200 and len(r.body["leases"]) == 1


async def test_racing_workers_over_https_never_exceed_capacity(gateway: RunningGateway) -> None:
    for _ in range(40):
        await gateway.task()
    workers: list[WorkerClient] = [await gateway.worker(capacity=3) for _ in range(8)]
    answers = await asyncio.gather(*(w.acquire(max_tasks=5) for w in workers for _ in range(3)))
    leases = [lease for a in answers if a.status == 200 for lease in a.body["leases"]]
    assert len(leases) == 24  # eight workers, three each
    assert len({lease["task"]["id"] for lease in leases}) == 24
    assert await gateway.count("SELECT max(n) FROM (SELECT count(*) AS n FROM worker_task_attempts"
                               " WHERE status IN ('leased', 'running') GROUP BY worker_id) c") == 3
