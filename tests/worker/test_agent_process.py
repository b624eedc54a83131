"""The worker agent as a real process (`leasehold worker run`): killed with SIGKILL mid-task,
shut down gracefully with SIGTERM, and made to exit at once by a second signal."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any
from uuid import UUID

from domain.results import payload_sha256
from support.agent import (
    AgentProcess,
    agent_process,
    attempts,
    batches,
    eventually,
    kill_group,
    pid_alive,
    pid_in,
    read_pid,
    records,
    register_worker,
    rows,
    running_agent,
    task_state,
    wait_state,
    write_plugin,
)
from support.gateway import RunningGateway


async def _acquired(agent: AgentProcess, task_id: UUID) -> dict[str, Any] | None:
    """The agent's "task acquired" log line for ``task_id`` (JSON logs), once there is one."""
    for line in agent.log_lines():
        if line.get("msg") == "task acquired" and line.get("task_id") == str(task_id):
            return line
    return None


async def test_sigkilled_worker_loses_its_lease_the_task_completes_once_elsewhere_and_late_writes_fail(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    marker, pid_file = tmp_path / "first-attempt-ran", tmp_path / "plugin.pid"
    write_plugin(plugins_dir, "sleepy", f"""
        #!/bin/sh
        if [ -e {marker} ]; then
            echo '{{"type": "raw", "attempt": "'$LEASEHOLD_ATTEMPT_NUMBER'"}}'
            exit 0
        fi
        touch {marker}
        echo $$ > {pid_file}
        exec sleep 60
    """)
    doomed = await register_worker(gateway, ("sleepy",))
    survivor = await register_worker(gateway, ("sleepy",))
    task_id = await gateway.task(task_type="sleepy", lease_seconds=2, max_attempts=3)

    async with agent_process(doomed.argv(gateway, plugins_dir=plugins_dir), tmp_path / "doomed.log") as agent:
        plugin_pid = await read_pid(pid_file)
        try:
            acquired = await eventually(lambda: _acquired(agent, task_id), what="the doomed agent's lease")
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

            await eventually(plugin_gone, within=3, what="the orphaned plugin to die with its worker")
        finally:
            kill_group(plugin_pid)

    async with running_agent(survivor.settings(gateway, plugins_dir=plugins_dir)):
        await wait_state(gateway, task_id, "completed", within=15)
    recovered_after = time.monotonic() - killed_at

    first, second = await attempts(gateway, task_id)
    assert (first["status"], first["worker_id"]) == ("expired", doomed.client.id)
    assert (second["status"], second["worker_id"]) == ("succeeded", survivor.client.id)
    assert (await task_state(gateway, task_id))[:2] == ("completed", 2)
    assert recovered_after < 10
    [batch] = await batches(gateway, task_id)
    assert batch["attempt_id"] == second["id"] and batch["final"]
    assert await records(gateway, task_id) == [{"type": "raw", "attempt": "2"}]

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
    [(rejected,)] = await rows(gateway, "SELECT count(*) FROM events WHERE originator_id = %s "
                                        "AND topic LIKE '%%WriteRejected'", task_id)
    assert rejected == 5
    assert (await task_state(gateway, task_id))[:2] == ("completed", 2)
    assert len(await batches(gateway, task_id)) == 1


async def test_sigterm_lets_running_plugins_finish_within_the_grace_then_fails_the_rest_and_exits_0(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    started = tmp_path / "started"
    started.mkdir()
    write_plugin(plugins_dir, "brief", f"""
        #!/bin/sh
        touch {started}/brief
        sleep 1
        echo '{{"type": "raw", "finished": true}}'
    """)
    write_plugin(plugins_dir, "endless", f"""
        #!/bin/sh
        echo $$ > {started}/endless
        exec sleep 60
    """)
    worker = await register_worker(gateway, ("brief", "endless"))
    brief = await gateway.task(task_type="brief")
    endless = await gateway.task(task_type="endless")
    argv = worker.argv(gateway, plugins_dir=plugins_dir, shutdown_grace_seconds=2.5, kill_grace_seconds=1)
    async with agent_process(argv, tmp_path / "agent.log") as agent:
        endless_pid = await read_pid(started / "endless")
        try:
            await eventually(lambda: asyncio.sleep(0, result=(started / "brief").exists()), what="brief to start")
            agent.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            late = await gateway.task(task_type="brief")  # arrives after the signal: never taken
            code = await asyncio.wait_for(agent.process.wait(), 15)
            took = time.monotonic() - signalled
        finally:
            kill_group(endless_pid)

    assert code == 0, agent.log_text()
    assert 2.5 <= took < 12, took  # the grace is waited out; generous upper bound for a loaded CI box
    assert not pid_alive(endless_pid)
    assert (await task_state(gateway, brief))[0] == "completed"
    state, attempt_count, error = await task_state(gateway, endless)
    assert (state, attempt_count) == ("retry_wait", 1)  # failed as retryable: another worker will retry it
    assert error is not None and "worker shutting down" in error
    assert (await task_state(gateway, late))[:2] == ("pending", 0)
    messages = [line["msg"] for line in agent.log_lines()]
    assert "signal received" in messages and "worker stopped" in messages
    assert all("lease_token" not in line for line in agent.log_lines())
    assert '"level":"INFO","logger":"leasehold.worker.status","msg":"status"' in agent.log_text()


async def test_second_signal_exits_at_once_and_takes_the_plugins_along(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "endless.pid"
    write_plugin(plugins_dir, "endless", f"""
        #!/bin/sh
        echo $$ > {pid_file}
        exec sleep 60
    """)
    worker = await register_worker(gateway, ("endless",))
    task_id = await gateway.task(task_type="endless")
    argv = worker.argv(gateway, plugins_dir=plugins_dir, shutdown_grace_seconds=60)
    async with agent_process(argv, tmp_path / "agent.log") as agent:
        pid = await read_pid(pid_file)
        try:
            agent.process.send_signal(signal.SIGINT)
            await eventually(lambda: asyncio.sleep(0, result="signal received" in agent.log_text()),
                             what="the first signal to be handled")
            agent.process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(agent.process.wait(), 3)
        finally:
            kill_group(pid)
    assert code == 1
    assert not pid_alive(pid) and pid_in(pid_file) == pid
    assert (await task_state(gateway, task_id))[0] == "running"  # its lease simply expires later
