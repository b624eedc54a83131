"""The worker agent runs where only the base install is: `leasehold worker run` as a process in
which the database drivers and the server's packages cannot be imported (:mod:`support.slim`)
leases a task from a real Gateway, runs its built-in plugin, and completes it."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from support.agent import agent_process, records, register_worker, task_state, wait_state
from support.gateway import RunningGateway
from support.slim import without_server_env


@asynccontextmanager
async def listening_port() -> AsyncIterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections (and closes them)."""
    async def close(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(close, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def test_the_blocker_makes_server_modules_unimportable(tmp_path: Path) -> None:
    """Without this, the test below would prove nothing."""
    blocked_log = tmp_path / "blocked.log"
    env = without_server_env(tmp_path / "site", blocked_log)
    for module in ("psycopg", "leasehold.gateway.app", "leasehold.persistence"):
        done = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True,
                              text=True, check=False)
        assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr, (module, done.stderr)
    logged = [line.split()[1] for line in blocked_log.read_text().splitlines()]
    assert logged == ["psycopg", "leasehold.gateway", "leasehold.persistence"]


async def test_agent_without_server_packages_completes_a_task_end_to_end(
        gateway: RunningGateway, tmp_path: Path) -> None:
    blocked_log = tmp_path / "blocked.log"
    env = without_server_env(tmp_path / "site", blocked_log)
    worker = await register_worker(gateway, ("tcp-connect",))
    async with listening_port() as port:
        task_id = await gateway.task(task_type="tcp-connect", scope={"targets": ["127.0.0.1"], "ports": [port]},
                                     parameters={"timeout": 2})
        async with agent_process(worker.argv(gateway), tmp_path / "agent.log", env=env) as agent:
            await wait_state(gateway, task_id, "completed", "failed_terminal", "retry_wait", within=30)
            agent.process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(agent.process.wait(), 15)

    assert (await task_state(gateway, task_id))[0] == "completed", agent.log_text()
    assert code == 0, agent.log_text()
    found = await records(gateway, task_id)
    assert any(r["type"] == "asset" and r["value"] == f"127.0.0.1:{port}/tcp" for r in found), found
    # Neither the agent nor its plugin so much as tried (an attempt caught by the code would not
    # have stopped the task, but would fail on a worker host all the same).
    assert not blocked_log.exists(), blocked_log.read_text()
