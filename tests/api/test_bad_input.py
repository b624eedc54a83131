"""A hostile client's bad input gets 4xx problem+json and changes nothing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from leasehold.domain.results import payload_sha256
from support.gateway import RunningGateway, WorkerClient


async def events(gateway: RunningGateway) -> int:
    return int(await gateway.count("SELECT count(*) FROM events"))


async def leased(gateway: RunningGateway) -> tuple[WorkerClient, dict[str, Any]]:
    worker = await gateway.worker()
    await gateway.task()
    lease = (await worker.acquire()).body["lease"]
    await worker.write(lease, "progress")
    return worker, lease


def assert_problem(reply: Any, status: int) -> None:
    assert reply.status == status, reply.body
    assert reply.headers["Content-Type"].startswith("application/problem+json")
    assert {"type", "title", "status", "detail"} <= set(reply.body) and reply.body["status"] == status


@pytest.mark.parametrize(("raw", "status"), [
    (b"{not json", 400),
    (b"[1, 2]", 400),
    (b'{"wait_seconds": "soon"}', 422),
    (b'{"wait_seconds": -1}', 422),
    (b'{"wait_seconds": 31}', 422),
    (b'{"wait_seconds": 0, "organization_id": "x"}', 422),
    (b'{"request_id": ""}', 422),
])
async def test_bad_acquire_bodies(gateway: RunningGateway, raw: bytes, status: int) -> None:
    worker = await gateway.worker()
    await gateway.task()
    before = await events(gateway)
    assert_problem(await worker.post("/v1/tasks/acquire", raw=raw), status)
    assert await events(gateway) == before


async def test_oversized_body_is_413(gateway: RunningGateway) -> None:
    worker, lease = await leased(gateway)
    before = await events(gateway)
    big = [{"type": "raw", "blob": "x" * 1024}] * 5000  # ~5 MB > the 4 MiB limit
    reply = await worker.write(lease, "results", sequence_number=1, idempotency_key="big",
                               payload_sha256=payload_sha256(big), payload=big, final=True)
    assert_problem(reply, 413)
    assert await events(gateway) == before


async def test_sha256_mismatch_is_refused(gateway: RunningGateway) -> None:
    worker, lease = await leased(gateway)
    before = await events(gateway)
    reply = await worker.write(lease, "results", sequence_number=1, idempotency_key="k",
                               payload_sha256="ab" * 32, payload=[{"type": "raw"}], final=True)
    assert_problem(reply, 422)
    assert await events(gateway) == before
    assert await gateway.count("SELECT count(*) FROM worker_result_batches") == 0


@pytest.mark.parametrize("body", [
    {"lease_token": 5},
    {"lease_token": "short"},
    {"lease_token": "x" * 40, "sequence_number": "one"},
    {},
])
async def test_wrong_types_on_writes(gateway: RunningGateway, body: dict[str, Any]) -> None:
    worker, lease = await leased(gateway)
    before = await events(gateway)
    path = f"/v1/tasks/{lease['task']['id']}/attempts/{lease['attempt_id']}/results"
    assert_problem(await worker.post(path, body), 422)
    assert await events(gateway) == before


@pytest.mark.parametrize("which", ["task", "attempt", "malformed"])
async def test_unknown_ids_are_404(gateway: RunningGateway, which: str) -> None:
    worker, lease = await leased(gateway)
    task, attempt = lease["task"]["id"], lease["attempt_id"]
    if which == "task":
        task = str(uuid.uuid4())
    elif which == "attempt":
        attempt = str(uuid.uuid4())
    else:
        task = "not-a-uuid"
    before = await events(gateway)
    reply = await worker.post(f"/v1/tasks/{task}/attempts/{attempt}/complete", {"lease_token": lease["lease_token"]})
    assert_problem(reply, 404)
    assert await events(gateway) == before


async def test_stale_token_is_409_and_only_the_refusal_is_recorded(gateway: RunningGateway) -> None:
    worker, lease = await leased(gateway)
    before = await events(gateway)
    reply = await worker.write({**lease, "lease_token": "A" * 43}, "complete")
    assert_problem(reply, 409)
    assert reply.body["type"].endswith("lease-lost")
    assert await events(gateway) == before + 1
    assert await gateway.count("SELECT topic FROM events ORDER BY notification_id DESC LIMIT 1") \
        == "domain.events:WriteRejected"
    assert await gateway.count("SELECT state FROM worker_tasks") == "running"


async def test_unknown_route_and_method(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    assert_problem(await worker.post("/v1/nothing-here", {}), 404)
    async with worker.session.get(worker.base + "/v1/tasks/acquire") as r:
        assert r.status == 405 and r.headers["Content-Type"].startswith("application/problem+json")


async def test_rate_limit_per_certificate_answers_429_with_retry_after(database_url: str, pki: Any) -> None:
    from support.gateway import running_gateway

    async with running_gateway(database_url, pki, rate_limit_per_second=0.5, rate_limit_burst=3) as gw:
        worker = await gw.worker()
        other = await gw.worker()
        replies = [await worker.acquire() for _ in range(4)]
        assert [r.status for r in replies[:3]] == [204, 204, 204]
        assert_problem(replies[3], 429)
        assert int(replies[3].headers["Retry-After"]) >= 1
        assert (await other.acquire()).status == 204  # another certificate has its own budget
