"""RFC failure table, "Worker crash": *lease expires; task retries if attempts remain.*

A real ``leasehold worker run`` process is SIGKILLed while its plugin runs: no goodbye, no
``fail``, no ``cancel-ack``. The lease sweeper expires its attempt (status ``expired``); with
attempts left the task goes to ``retry_wait`` and another worker process runs it to completion,
once; with none left it ends ``failed_terminal`` and nobody leases it again. Everything is read
from the database: attempts, task, scan job, and the task's events.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from uuid import UUID

from leasehold.domain.results import payload_sha256
from support.agent import (
    AgentProcess,
    agent_process,
    attempts,
    batches,
    kill_group,
    pid_alive,
    read_pid,
    records,
    register_worker,
    rows,
    sleepy_plugin,
    task_state,
    wait_state,
)
from support.gateway import RunningGateway
from support.waits import wait_until


async def acquired_line(agent: AgentProcess, task_id: UUID) -> dict[str, Any] | None:
    """The agent's "task acquired" log line for ``task_id`` (JSON logs), once there is one."""
    for line in agent.log_lines():
        if line.get("msg") == "task acquired" and line.get("task_id") == str(task_id):
            return line
    return None


async def task_events(gateway: RunningGateway, task_id: UUID) -> list[tuple[str, dict[str, Any]]]:
    """(event type, data) of the task's stream, in order."""
    found = await rows(gateway, "SELECT event_type, data FROM analyst_events WHERE originator_id = %s "
                                "ORDER BY originator_version", task_id)
    return [(r[0], r[1]) for r in found]


async def test_sigkilled_worker_loses_its_lease_the_task_completes_once_elsewhere_and_late_writes_fail(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    """RFC: "lease expires; task retries if attempts remain" — with attempts left."""
    pid_file, runs = sleepy_plugin(plugins_dir, tmp_path)
    doomed = await register_worker(gateway, ("sleepy",))
    survivor = await register_worker(gateway, ("sleepy",))
    task_id = await gateway.task(task_type="sleepy", lease_seconds=2, max_attempts=3)

    async with agent_process(doomed.argv(gateway, plugins_dir=plugins_dir), tmp_path / "doomed.log") as agent:
        plugin_pid = await read_pid(pid_file)
        try:
            acquired = await wait_until(lambda: acquired_line(agent, task_id), what="the doomed agent's lease")
            await wait_state(gateway, task_id, "running")
            agent.process.kill()  # SIGKILL: no goodbye, no fail, no cancel-ack
            await agent.process.wait()
            killed_at = time.monotonic()
            # Recover the killed attempt's credentials the only way there is: its identity (the
            # certificate) and the request id it acquired with, which re-issues a token while
            # the lease lives. Its writes below stand for the late writes of a revived process.
            reissued = await doomed.client.acquire(request_id=acquired["request_id"])
            assert reissued.status == 200, reissued.body
            stale = reissued.body["lease"]
            assert stale["attempt_id"] == acquired["attempt_id"]

            async def plugin_gone() -> bool:
                return not pid_alive(plugin_pid)

            await wait_until(plugin_gone, timeout=3, what="the orphaned plugin to die with its worker")
        finally:
            kill_group(plugin_pid)

    # The other worker is a real process too, long-polling before the lease has even expired.
    async with agent_process(survivor.argv(gateway, plugins_dir=plugins_dir), tmp_path / "survivor.log"):
        await wait_state(gateway, task_id, "completed", within=20)
    recovered_after = time.monotonic() - killed_at

    first, second = await attempts(gateway, task_id)
    assert (first["status"], first["worker_id"]) == ("expired", doomed.client.id)
    assert (second["status"], second["worker_id"]) == ("succeeded", survivor.client.id)
    assert (await task_state(gateway, task_id))[:2] == ("completed", 2)
    assert recovered_after < 15
    [batch] = await batches(gateway, task_id)
    assert batch["attempt_id"] == second["id"] and batch["final"]
    assert await records(gateway, task_id) == [{"type": "raw", "attempt": "2"}]
    assert runs.read_text().split() == [str(first["id"]), "1", str(second["id"]), "2"]  # one run per attempt
    events = await task_events(gateway, task_id)
    # In order (renewals, batches and the re-issued token left out): nobody was told to cancel,
    # the Gateway expired the lease and the task went on elsewhere.
    assert [kind for kind, _ in events if kind not in ("LeaseRenewed", "ResultBatchAccepted", "LeaseReissued")] == [
        "TaskCreated", "TaskLeased", "TaskStarted", "LeaseExpired", "TaskLeased", "TaskStarted", "TaskCompleted"]
    [expired] = [data for kind, data in events if kind == "LeaseExpired"]
    assert (expired["attempt_id"], expired["outcome"]) == (str(first["id"]), "retry_wait")
    assert [data["attempt_id"] for kind, data in events if kind == "TaskCompleted"] == [str(second["id"])]
    [(job_status,)] = await rows(gateway, "SELECT j.status FROM scan_jobs j JOIN worker_tasks t "
                                          "ON t.scan_job_id = j.id WHERE t.id = %s", task_id)
    assert job_status == "success"

    late = [{"type": "raw", "late": True}]
    for action, body in [
        ("renew", {}), ("progress", {}), ("complete", {}), ("fail", {"error": "late", "retryable": True}),
        ("results", {"sequence_number": 1, "idempotency_key": "late-1", "payload_sha256": payload_sha256(late),
                     "payload": late, "final": True}),
    ]:
        reply = await doomed.client.write(stale, action, **body)
        assert reply.status == 409, (action, reply.body)
        assert reply.headers["Content-Type"].startswith("application/problem+json")
        assert reply.body["type"].endswith("lease-lost"), reply.body
    rejected = [data for kind, data in await task_events(gateway, task_id) if kind == "WriteRejected"]
    assert len(rejected) == 5 and {r["attempt_id"] for r in rejected} == {str(first["id"])}
    assert (await task_state(gateway, task_id))[:2] == ("completed", 2)
    assert len(await batches(gateway, task_id)) == 1
    [(raw_rows,)] = await rows(gateway, "SELECT count(*) FROM raw_outputs o JOIN worker_tasks t "
                                        "ON t.scan_job_id = o.scan_job_id WHERE t.id = %s", task_id)
    assert raw_rows == 1  # the late batch was not ingested


async def test_sigkilled_worker_on_the_last_attempt_fails_the_task_and_nobody_leases_it_again(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    """RFC: "task retries if attempts remain" — and only then: the last attempt's expiry is terminal."""
    pid_file, runs = sleepy_plugin(plugins_dir, tmp_path)
    doomed = await register_worker(gateway, ("sleepy",))
    bystander = await register_worker(gateway, ("sleepy",))
    task_id = await gateway.task(task_type="sleepy", lease_seconds=2, max_attempts=1)

    async with agent_process(doomed.argv(gateway, plugins_dir=plugins_dir), tmp_path / "doomed.log") as agent:
        plugin_pid = await read_pid(pid_file)
        try:
            await wait_state(gateway, task_id, "running")
            # Another worker process long-polls from now on: it must never be offered the task.
            async with agent_process(bystander.argv(gateway, plugins_dir=plugins_dir),
                                     tmp_path / "bystander.log") as other:
                agent.process.kill()
                await agent.process.wait()
                kill_group(plugin_pid)
                await wait_state(gateway, task_id, "failed_terminal", within=15)
                # A fresh task (its own scan: the first one has ended) shows the bystander still polls.
                scan = await gateway.scans.create_scan(gateway.org, {"targets": ["127.0.0.1"]})
                fresh = await gateway.task(task_type="sleepy", scan=scan)
                await wait_state(gateway, fresh, "completed", within=15)
                assert other.process.returncode is None
                assert [a["worker_id"] for a in await attempts(gateway, fresh)] == [bystander.client.id]
        finally:
            kill_group(plugin_pid)

    [only] = await attempts(gateway, task_id)
    assert only["status"] == "expired"
    assert (await task_state(gateway, task_id))[:2] == ("failed_terminal", 1)
    events = await task_events(gateway, task_id)
    [expired] = [data for kind, data in events if kind == "LeaseExpired"]
    assert (expired["outcome"], expired["available_at"]) == ("failed_terminal", None)
    assert [kind for kind, _ in events].count("TaskLeased") == 1
    assert await batches(gateway, task_id) == []
    assert len(runs.read_text().splitlines()) == 2  # the killed run and the fresh task's run
    [(job_status,)] = await rows(gateway, "SELECT j.status FROM scan_jobs j JOIN worker_tasks t "
                                          "ON t.scan_job_id = j.id WHERE t.id = %s", task_id)
    assert job_status == "failed"

