"""Helpers for worker agent tests: workers registered with a test Gateway, agents run in-process
or as `leasehold worker run` subprocesses, test plugins written into directories, and readers
of what the Gateway stored."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import orjson

from leasehold.domain.retry import RetryPolicy
from leasehold.worker.agent import Agent
from leasehold.worker.settings import WorkerSettings
from support.gateway import RunningGateway, WorkerClient
from support.waits import wait_until

T = TypeVar("T")

#: Retries come back after 0.1-0.2 s instead of 1-2 s, so retry tests stay fast.
FAST_RETRIES = RetryPolicy(base_seconds=0.2, cap_seconds=1.0, jitter=0.5)


def write_plugin(directory: Path, name: str, script: str) -> Path:
    """Write an executable plugin ``directory/name`` (a ``#!`` script, dedented)."""
    path = directory / name
    path.write_text(textwrap.dedent(script).lstrip())
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def python_plugin(directory: Path, name: str, body: str) -> Path:
    """A Python plugin run by this interpreter (``body`` is dedented)."""
    return write_plugin(directory, name, f"#!{sys.executable}\n" + textwrap.dedent(body))


def sleepy_plugin(plugins_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Plugin ``sleepy``: its first run writes its pid and sleeps; later runs report one record.
    Returns (pid file, run log): every run appends its attempt number to the log."""
    marker, pid_file, runs = tmp_path / "first-attempt-ran", tmp_path / "plugin.pid", tmp_path / "runs"
    write_plugin(plugins_dir, "sleepy", f"""
        #!/bin/sh
        echo "$LEASEHOLD_ATTEMPT_ID $LEASEHOLD_ATTEMPT_NUMBER" >> {runs}
        if [ -e {marker} ]; then
            echo '{{"type": "raw", "attempt": "'$LEASEHOLD_ATTEMPT_NUMBER'"}}'
            exit 0
        fi
        touch {marker}
        echo $$ > {pid_file}
        exec sleep 60
    """)
    return pid_file, runs


@dataclass
class Worker:
    """A worker registered with the Gateway: its HTTP client (for hand-made requests) and
    certificate files (for an agent)."""

    client: WorkerClient
    cert: Path
    key: Path

    def settings(self, gateway: RunningGateway, /, **overrides: Any) -> WorkerSettings:
        values: dict[str, Any] = {
            "gateway": gateway.worker_url, "cert": self.cert, "key": self.key, "ca": gateway.pki.ca_cert,
            "wait_seconds": 5, "batch_seconds": 0.2, "kill_grace_seconds": 1.0, "shutdown_grace_seconds": 5.0,
            "request_timeout_seconds": 5.0, "backoff_initial_seconds": 0.05, "backoff_max_seconds": 0.5,
            **overrides}
        return WorkerSettings(**values)

    def argv(self, gateway: RunningGateway, /, **options: Any) -> list[str]:
        """``leasehold worker run`` arguments for a subprocess agent."""
        args = ["--gateway", gateway.worker_url, "--cert", str(self.cert), "--key", str(self.key),
                "--ca", str(gateway.pki.ca_cert), "--log-format", "json"]
        defaults = {"wait_seconds": 5, "batch_seconds": 0.2, "kill_grace_seconds": 1.0,
                    "request_timeout_seconds": 5.0, "backoff_initial_seconds": 0.05, "backoff_max_seconds": 0.5}
        for name, value in {**defaults, **options}.items():
            for item in value if isinstance(value, list) else [value]:
                args += ["--" + name.replace("_", "-"), str(item)]
        return args


async def register_worker(gateway: RunningGateway, task_types: tuple[str, ...], *, capacity: int = 8) -> Worker:
    client = await gateway.worker(task_types=task_types, capacity=capacity)
    workers_dir = gateway.pki.directory / "workers"
    return Worker(client, workers_dir / f"{client.name}.pem", workers_dir / f"{client.name}-key.pem")


@asynccontextmanager
async def running_agent(settings: WorkerSettings) -> AsyncIterator[Agent]:
    """An agent running in this event loop; stopped (gracefully) on exit."""
    agent = Agent(settings)
    task = asyncio.create_task(agent.run())
    try:
        yield agent
    finally:
        agent.request_stop()
        try:
            await asyncio.wait_for(task, 20)
        finally:
            agent.kill_now()


@dataclass
class AgentProcess:
    process: asyncio.subprocess.Process
    log_path: Path

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for raw in self.log_path.read_bytes().splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                lines.append(orjson.loads(raw))
        return lines

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@asynccontextmanager
async def agent_process(argv: list[str], log_path: Path, *,
                        env: Mapping[str, str] | None = None) -> AsyncIterator[AgentProcess]:
    """``leasehold worker run ARGV`` as a subprocess (stderr into ``log_path``, environment ``env``,
    default this process's); killed on exit."""
    leasehold = Path(sys.executable).with_name("leasehold")
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(str(leasehold), "worker", "run", *argv,
                                                       stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL,
                                                       env=env)
    try:
        yield AgentProcess(process, log_path)
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


async def eventually(check: Callable[[], Awaitable[T | None]], *, within: float = 15.0,
                     interval: float = 0.05, what: str = "condition") -> T:
    """Older name of :func:`support.waits.wait_until` (``within`` is its ``timeout``); new tests
    call that."""
    return await wait_until(check, within, what=what, interval=interval)  # type: ignore[arg-type]


async def rows(gateway: RunningGateway, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with gateway.pool.connection() as conn:
        cur = await conn.execute(query, params)
        return list(await cur.fetchall())


async def task_state(gateway: RunningGateway, task_id: UUID) -> tuple[str, int, str | None]:
    """(state, attempt_count, last_error) of a task."""
    [row] = await rows(gateway, "SELECT state, attempt_count, last_error FROM worker_tasks WHERE id = %s", task_id)
    return row[0], row[1], row[2]


async def wait_state(gateway: RunningGateway, task_id: UUID, *states: str, within: float = 15.0) -> str:
    async def check() -> str | None:
        state = (await task_state(gateway, task_id))[0]
        return state if state in states else None

    return await wait_until(check, timeout=within, what=f"task {task_id} to be {'/'.join(states)}")


async def attempts(gateway: RunningGateway, task_id: UUID) -> list[dict[str, Any]]:
    found = await rows(gateway, """
        SELECT id, attempt_number, status, error, worker_id FROM worker_task_attempts
        WHERE task_id = %s ORDER BY attempt_number""", task_id)
    return [{"id": r[0], "number": r[1], "status": r[2], "error": r[3], "worker_id": r[4]} for r in found]


async def batches(gateway: RunningGateway, task_id: UUID) -> list[dict[str, Any]]:
    """Accepted result batches of a task, with their records."""
    found = await rows(gateway, """
        SELECT b.attempt_id, b.sequence_number, b.idempotency_key, b.final, b.accepted_at, p.body
        FROM worker_result_batches b JOIN result_payloads p ON p.sha256 = b.payload_sha256
        WHERE b.task_id = %s ORDER BY b.accepted_at, b.sequence_number""", task_id)
    return [{"attempt_id": r[0], "sequence_number": r[1], "idempotency_key": r[2], "final": r[3],
             "accepted_at": r[4], "records": orjson.loads(r[5])} for r in found]


async def records(gateway: RunningGateway, task_id: UUID) -> list[dict[str, Any]]:
    return [record for batch in await batches(gateway, task_id) for record in batch["records"]]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone as far as running goes.
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
        return status != "Z"
    return True


def kill_group(pid: int) -> None:
    """Clean up after a test plugin, whatever the test did."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def pid_in(path: Path) -> int | None:
    """The pid a test plugin wrote into ``path``, if it did yet."""
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text.isdigit() else None


async def read_pid(path: Path, within: float = 10.0) -> int:
    async def check() -> int | None:
        return pid_in(path)

    return await wait_until(check, timeout=within, what=f"pid file {path}")
