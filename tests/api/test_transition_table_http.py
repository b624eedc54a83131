"""The RFC transition table driven over HTTP: each row's actor, precondition and idempotency.

Each case builds a task in a given state through the API, sends one worker request twice (the
second time to check the idempotency rule), and checks the answer and the task state.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import pytest

from leasehold.domain.retry import RetryPolicy
from support.gateway import Reply, RunningGateway, WorkerClient
from support.waits import wait_until


async def prepared(gateway: RunningGateway, state: str) -> tuple[WorkerClient, dict[str, Any]]:
    worker = await gateway.worker()
    await gateway.task(max_attempts=2)
    lease = (await worker.acquire()).body["lease"]
    if state in ("running", "final", "cancelling"):
        await worker.write(lease, "progress")
    if state == "final":
        await worker.final_batch(lease)
    if state == "cancelling":
        await gateway.lifecycle.request_cancel(UUID(lease["task"]["id"]))
    return worker, lease


# (state before, action, body, first status, state after, second status, state after repeat)
ROWS = [
    ("leased", "progress", {}, 200, "running", 200, "running"),  # leased -> running; repeat idempotent
    ("running", "renew", {}, 200, "running", 200, "running"),  # running -> running; safe to repeat
    ("running", "complete", {}, 409, "running", 409, "running"),  # complete needs an accepted final batch
    ("final", "complete", {}, 200, "completed", 200, "completed"),  # -> completed; repeat returns it
    ("running", "fail", {"error": "x"}, 200, "retry_wait", 200, "retry_wait"),  # retryable, attempts left
    ("running", "fail", {"error": "x", "retryable": False}, 200, "failed_terminal", 200, "failed_terminal"),
    ("cancelling", "renew", {}, 200, "cancelling", 200, "cancelling"),  # answers cancel_requested
    ("cancelling", "results", None, 409, "cancelling", 409, "cancelling"),  # no results after cancel
    ("cancelling", "cancel-ack", {}, 200, "cancelled", 200, "cancelled"),  # -> cancelled; repeat no-op
    ("running", "cancel-ack", {}, 409, "running", 409, "running"),  # nothing to acknowledge
]


@pytest.mark.parametrize(("before", "action", "body", "first", "after", "second", "after_repeat"), ROWS,
                         ids=[f"{r[0]}-{r[1]}-{r[3]}" for r in ROWS])
async def test_transition_row(gateway: RunningGateway, before: str, action: str, body: dict[str, Any] | None,
                              first: int, after: str, second: int, after_repeat: str) -> None:
    worker, lease = await prepared(gateway, before)
    send = (lambda: worker.final_batch(lease)) if body is None else (lambda: worker.write(lease, action, **body))
    r1 = await send()
    assert r1.status == first, r1.body
    assert await gateway.count("SELECT state FROM worker_tasks") == after
    events_after_first = await gateway.count("SELECT count(*) FROM events")
    r2 = await send()
    assert r2.status == second, r2.body
    assert await gateway.count("SELECT state FROM worker_tasks") == after_repeat
    if first == second == 200 and not (action == "renew" and before == "running"):
        # The repeat was a no-op (a running renew is "safe to repeat": it extends again).
        assert await gateway.count("SELECT count(*) FROM events") == events_after_first
    if r1.status == 200:
        assert r1.body["task"]["state"] == after  # every answer states the task state


async def test_cancel_before_acquire_cancels_at_once(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    task = await gateway.task()
    await gateway.lifecycle.request_cancel(task)  # pending -> cancelled
    assert await gateway.count("SELECT state FROM worker_tasks") == "cancelled"
    assert (await worker.acquire()).status == 204


async def test_acquire_after_backoff(gateway: RunningGateway) -> None:
    """retry_wait -> leased only once ``available_at`` has passed: a failed attempt's task is not
    handed out during its backoff (0.8 s here, no jitter), then is, as attempt 2."""
    gateway.lifecycle.retry_policy = RetryPolicy(base_seconds=0.8, cap_seconds=0.8, jitter=0.0)
    worker = await gateway.worker()
    task = await gateway.task(max_attempts=2)
    lease = (await worker.acquire()).body["lease"]
    await worker.write(lease, "progress")
    failed = await worker.write(lease, "fail", error="flaky target")
    assert failed.status == 200 and failed.body["task"]["state"] == "retry_wait"
    available_at = await gateway.count("SELECT available_at FROM worker_tasks WHERE id = %s", task)
    failed_at = await gateway.count("SELECT finished_at FROM worker_task_attempts WHERE task_id = %s", task)
    assert available_at - failed_at == timedelta(seconds=0.8)  # the backoff, not "at once"
    refused_during_backoff = 0

    async def offered_again() -> tuple[Reply, datetime] | None:
        nonlocal refused_during_backoff
        reply = await worker.acquire()
        now = await gateway.count("SELECT now()")
        if reply.status == 200:
            return reply, now
        assert reply.status == 204, (reply.status, reply.body)
        refused_during_backoff += 1
        return None

    reply, now = await wait_until(offered_again, 5, what="the task to be offered once its backoff is over",
                                  interval=0.05)
    assert refused_during_backoff > 0
    again = reply.body["lease"]
    assert again["task"]["id"] == str(task) and again["attempt_id"] != lease["attempt_id"]
    assert now >= available_at  # handed out only after the backoff
    assert await gateway.count("SELECT attempt_count FROM worker_tasks WHERE id = %s", task) == 2


async def test_gateway_restart_keeps_leases(database_url: str, pki: Any) -> None:
    from support.gateway import running_gateway

    async with running_gateway(database_url, pki) as first:
        worker = await first.worker()
        await first.task()
        lease = (await worker.acquire()).body["lease"]
        await worker.write(lease, "progress")
        cert_worker = worker
    # A new Gateway process on the same database: the lease lives in PostgreSQL.
    async with running_gateway(database_url, pki) as second:
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            ssl=second.worker_ssl(*_cert_paths(second, cert_worker.name))))
        second.sessions.append(session)
        again = WorkerClient(cert_worker.name, cert_worker.id, cert_worker.fingerprint, session, second.worker_url)
        r = await again.write(lease, "renew")
        assert r.status == 200 and r.body["task"]["state"] == "running"
        assert (await again.final_batch(lease)).status == 200
        assert (await again.write(lease, "complete")).status == 200
        assert await second.count("SELECT count(*) FROM worker_task_attempts") == 1


def _cert_paths(gw: RunningGateway, name: str) -> tuple[Any, Any]:
    d = gw.pki.directory / "workers"
    return d / f"{name}.pem", d / f"{name}-key.pem"
