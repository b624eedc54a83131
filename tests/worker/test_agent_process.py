"""The worker agent as a real process (`leasehold worker run`): shut down gracefully with SIGTERM,
and made to exit at once by a second signal. (Killed with SIGKILL mid-task: see
``tests/failures/test_worker_crash.py``.)"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from uuid import UUID

from support.agent import (
    agent_process,
    kill_group,
    pid_alive,
    pid_in,
    read_pid,
    register_worker,
    task_state,
    write_plugin,
)
from support.gateway import RunningGateway
from support.waits import wait_until


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
            await wait_until(lambda: (started / "brief").exists(), what="brief to start")
            agent.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            # Once the agent has begun shutting down, a new task is never taken. (A long-poll the
            # Gateway answers while the signal is still on its way is lost with the process's
            # stop, and that lease ends by expiry.)
            await wait_until(lambda: "shutting down" in agent.log_text(),
                             what="the agent to begin shutting down")
            late = await gateway.task(task_type="brief")
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


async def _state_is(gateway: RunningGateway, task_id: UUID, state: str) -> bool:
    return (await task_state(gateway, task_id))[0] == state


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
            # The plugin runs before the worker's `progress` write lands; wait for that write, so the
            # state below is what the signals left and not how far the worker had got.
            await wait_until(lambda: _state_is(gateway, task_id, "running"), what="the task to run")
            agent.process.send_signal(signal.SIGINT)
            await wait_until(lambda: "signal received" in agent.log_text(),
                             what="the first signal to be handled")
            agent.process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(agent.process.wait(), 3)
        finally:
            kill_group(pid)
    assert code == 1
    assert not pid_alive(pid) and pid_in(pid_file) == pid
    assert (await task_state(gateway, task_id))[0] == "running"  # its lease simply expires later
