"""The execution deadline over HTTP: an attempt renewed on time until its deadline ends as a
timeout (attempt ``timeout``, task ``failed_terminal``, job ``timeout``), the log and the timeline
say deadline, and every worker write after the deadline is answered 409 ``deadline-exceeded``."""

from __future__ import annotations

import asyncio
from datetime import datetime
from uuid import UUID

from leasehold.replay.timeline import task_timeline
from support.gateway import Reply, RunningGateway
from support.waits import wait_until


def assert_refused_for_the_deadline(reply: Reply) -> None:
    assert reply.status == 409, reply.body
    assert reply.headers["Content-Type"].startswith("application/problem+json")
    assert reply.body["type"].endswith("/deadline-exceeded"), reply.body
    assert reply.body["reason"] == "deadline_passed", reply.body


async def test_an_attempt_renewed_on_time_until_its_deadline_times_out(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    # The lease is as long as the execution timeout, so a slow machine cannot make a renewal
    # late; the service-layer tests show a lease that runs into its cap by renewals.
    task = await gateway.task(lease_seconds=2, execution_timeout_seconds=2, max_attempts=3)
    lease = (await worker.acquire()).body["lease"]
    deadline_at = datetime.fromisoformat(lease["deadline_at"])
    assert (await worker.write(lease, "progress")).status == 200

    # Renew every 0.3 s until the Gateway refuses.
    answers: list[Reply] = []
    while not answers or answers[-1].status == 200:
        answers.append(await worker.write(lease, "renew"))
        if answers[-1].status == 200:
            await asyncio.sleep(0.3)  # the renewal schedule under test, as an agent keeps it
    *on_time, refused = answers
    assert len(on_time) >= 2
    assert all(datetime.fromisoformat(r.body["lease_expires_at"]) == deadline_at for r in on_time)  # capped
    assert_refused_for_the_deadline(refused)

    async def attempt_status() -> str | None:
        status = await gateway.count("SELECT status FROM worker_task_attempts WHERE task_id = %s", task)
        return status if status not in ("leased", "running") else None

    assert await wait_until(attempt_status, 5, what="the attempt to time out", interval=0.05) == "timeout"
    assert await gateway.count("SELECT row(state, attempt_count, last_error)::text FROM worker_tasks"
                               " WHERE id = %s", task) == '(failed_terminal,1,"execution deadline exceeded")'
    assert await gateway.count("SELECT j.status FROM scan_jobs j JOIN worker_tasks t ON t.scan_job_id = j.id"
                               " WHERE t.id = %s", task) == "timeout"
    # Attempts remained, but a timeout is not retried.
    assert (await worker.acquire()).status == 204

    # Every later write is refused for the deadline too, and changes nothing.
    events_before = await gateway.count("SELECT count(*) FROM events WHERE originator_id = %s", task)
    assert_refused_for_the_deadline(await worker.write(lease, "renew"))
    assert_refused_for_the_deadline(await worker.final_batch(lease))
    assert_refused_for_the_deadline(await worker.write(lease, "fail", error="too late"))
    assert await gateway.count("SELECT count(*) FROM events WHERE originator_id = %s", task) == events_before + 3
    assert await gateway.count("SELECT count(*) FROM worker_result_batches") == 0

    async with gateway.pool.connection() as conn:
        entries = await task_timeline(conn, UUID(str(task)))
    ended = [e for e in entries if e.event_type == "AttemptTimedOut"]
    assert len(ended) == 1 and ended[0].actor == "sweeper"
    assert ended[0].transition == "running → failed_terminal"
    assert "timed out: execution deadline" in ended[0].summary
    assert not any(e.event_type == "LeaseExpired" for e in entries)
    rejected = [e.summary for e in entries if e.rejected]
    assert rejected and all(s.endswith(": deadline_passed") for s in rejected), rejected
