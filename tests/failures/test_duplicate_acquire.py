"""RFC failure table, "Duplicate acquire requests": *FOR UPDATE SKIP LOCKED prevents two Workers
from leasing the same task.*

The Gateway is a real ``leasehold gateway serve --processes 2`` (two processes sharing the ports
with SO_REUSEPORT, so racing requests are served by different processes and meet only in
PostgreSQL). Every storm below opens all its HTTPS connections first (TLS handshakes done), then
sends one request on each at once, and checks the outcome in the database:

* identical requests (one worker, one ``request_id``): exactly one attempt is created; every
  answer names it (each with a fresh token, of which exactly the last one issued still works);
* one worker without ``request_id``: never more live leases than its ``max_concurrent_tasks``;
* many workers at once: no task is leased twice, every task exactly once.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import orjson
import pytest

from leasehold.gateway.services import build_services
from leasehold.gateway.tls import PkiPaths
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database
from support.gateway import GatewayProcess, RunningGateway, WorkerClient


@dataclass
class Setup:
    gateway: RunningGateway  # a view of the serving processes, with the test's own pool
    process: GatewayProcess

    async def rows(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        async with self.gateway.pool.connection() as conn:
            cur = await conn.execute(query, params)
            return list(await cur.fetchall())


@pytest.fixture
async def served(database_url: str, pki: PkiPaths, tmp_path: Path) -> AsyncIterator[Setup]:
    pool = create_pool(database_url, min_size=1, max_size=4)
    await pool.open()
    services = build_services(Database(pool))
    org = await services.registry.create_organization(f"org-{uuid4().hex[:8]}")
    scan = await services.scans.create_scan(org, {"targets": ["192.0.2.10"]})
    process = GatewayProcess(database_url, pki, tmp_path / "gateway.log", {"processes": 2})
    await process.start()
    view = process.client(services, org, scan)
    try:
        yield Setup(view, process)
    finally:
        for session in view.sessions:
            await session.close()
        assert await process.stop() == 0, process.log_tail()
        await pool.close()


async def storm(gateway: RunningGateway, requests: list[tuple[WorkerClient, dict[str, Any]]]) -> list[Any]:
    """POST /v1/tasks/acquire once per (worker, body), each over its own HTTPS connection: every
    connection is established before any request is sent. Returns (status, body) per request."""
    port = int(gateway.worker_url.rsplit(":", 1)[1])
    workers = gateway.pki.directory / "workers"

    def context(worker: WorkerClient) -> ssl.SSLContext:
        return gateway.worker_ssl(workers / f"{worker.name}.pem", workers / f"{worker.name}-key.pem")

    contexts = {w.name: context(w) for w, _ in requests}
    async with asyncio.timeout(30):
        connections = await asyncio.gather(*(
            asyncio.open_connection("127.0.0.1", port, ssl=contexts[w.name], server_hostname="localhost")
            for w, _ in requests))
        for (_, writer), (_, body) in zip(connections, requests, strict=True):
            data = orjson.dumps(body)
            writer.write(b"POST /v1/tasks/acquire HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
        await asyncio.gather(*(writer.drain() for _, writer in connections))
        answers = await asyncio.gather(*(reader.read() for reader, _ in connections))
    for _, writer in connections:
        writer.close()
    replies = []
    for raw in answers:
        head, _, payload = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        replies.append((status, orjson.loads(payload) if payload else None))
    return replies


async def event_types(setup: Setup, task_id: Any) -> list[str]:
    found = await setup.rows("SELECT event_type FROM analyst_events WHERE originator_id = %s "
                             "ORDER BY originator_version", UUID(str(task_id)))
    return [r[0] for r in found]


async def test_identical_concurrent_acquires_lease_one_task_once(served: Setup) -> None:
    gw, n = served.gateway, 40
    tasks = [await gw.task() for _ in range(5)]
    worker = await gw.worker(capacity=10)
    request_id = f"storm-{uuid4().hex}"
    replies = await storm(gw, [(worker, {"request_id": request_id})] * n)

    assert [status for status, _ in replies] == [200] * n, replies
    leases = [body["lease"] for _, body in replies]
    assert len({(lease["task"]["id"], lease["attempt_id"]) for lease in leases}) == 1  # all the same attempt
    assert len({lease["lease_token"] for lease in leases}) == n  # each with a fresh token
    task_id, attempt_id = leases[0]["task"]["id"], leases[0]["attempt_id"]

    # The database: one attempt, for that request id; the other tasks untouched.
    attempts = await served.rows("SELECT task_id, id, attempt_number, status, acquire_request_id "
                                 "FROM worker_task_attempts")
    assert attempts == [(UUID(task_id), UUID(attempt_id), 1, "leased", request_id)]
    states = dict(await served.rows("SELECT id, state FROM worker_tasks WHERE id = ANY(%s)", tasks))
    assert sorted(states.values()) == ["leased"] + ["pending"] * 4 and states[UUID(task_id)] == "leased"
    assert await event_types(served, task_id) == ["TaskCreated", "TaskLeased"] + ["LeaseReissued"] * (n - 1)

    # Only the token issued last still holds the lease.
    renewed = [(await worker.write(lease, "renew")).status for lease in leases]
    assert sorted(renewed) == [200] + [409] * (n - 1)


async def test_concurrent_acquires_never_exceed_the_workers_capacity(served: Setup) -> None:
    gw, capacity, n = served.gateway, 3, 40
    for _ in range(20):
        await gw.task()
    worker = await gw.worker(capacity=capacity)
    replies = await storm(gw, [(worker, {})] * n)

    statuses = [status for status, _ in replies]
    assert sorted(statuses) == [200] * capacity + [204] * (n - capacity), statuses
    leased = {body["lease"]["task"]["id"] for status, body in replies if status == 200}
    assert len(leased) == capacity
    [(live, tasks_leased)] = await served.rows(
        "SELECT count(*), count(DISTINCT task_id) FROM worker_task_attempts "
        "WHERE worker_id = %s AND status IN ('leased', 'running')", worker.id)
    assert (live, tasks_leased) == (capacity, capacity)
    [(pending,)] = await served.rows("SELECT count(*) FROM worker_tasks WHERE state = 'pending'")
    assert pending == 20 - capacity


async def test_racing_workers_never_lease_the_same_task_twice(served: Setup) -> None:
    gw, n_tasks = served.gateway, 15
    tasks = {str(await gw.task()) for _ in range(n_tasks)}
    workers = [await gw.worker(capacity=4) for _ in range(10)]
    replies = await storm(gw, [(w, {}) for w in workers for _ in range(4)])  # 40 requests, 15 tasks

    leased = [body["lease"]["task"]["id"] for status, body in replies if status == 200]
    assert sorted(leased) == sorted(tasks)  # every task leased, none twice
    assert [status for status, _ in replies].count(204) == 40 - n_tasks
    assert await served.rows("SELECT task_id FROM worker_task_attempts GROUP BY task_id HAVING count(*) > 1") == []
    [(attempts, distinct)] = await served.rows("SELECT count(*), count(DISTINCT task_id) FROM worker_task_attempts")
    assert (attempts, distinct) == (n_tasks, n_tasks)
    for task_id in tasks:
        assert (await event_types(served, task_id)).count("TaskLeased") == 1
