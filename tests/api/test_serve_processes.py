"""``leasehold gateway serve --processes 2``: two processes share the ports (SO_REUSEPORT); the
supervisor restarts one that is killed, says so, and stops them all on SIGTERM (exit 0); /metrics
sums the counters of every process, a killed one's included. When the processes cannot start it
exits 1 at once with the cause."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from support.waits import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ANSWERED: list[int] = []  # /healthz answers of the test, for the summed counter


async def pids_serving(ctx: ssl.SSLContext, port: int, want: int, within: float) -> set[int]:
    """The pids answering /healthz on ``port``, asked over fresh connections until ``want`` are seen
    (a connection refused while the processes start is asked again)."""
    pids: set[int] = set()

    async def all_answered() -> bool:
        # A fresh connection each time, so the kernel may pick either process.
        with contextlib.suppress(aiohttp.ClientConnectorError):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, force_close=True)) as s, \
                    s.get(f"https://localhost:{port}/healthz") as r:
                pids.add((await r.json())["pid"])
                ANSWERED.append(r.status)
        return len(pids) >= want

    await wait_until(all_answered, within, what=f"{want} processes to answer on port {port}")
    return pids


async def test_two_processes_serve_one_port_and_a_killed_one_is_restarted(
        database_url: str, pki: Any, tmp_path: Path) -> None:
    worker_port, operator_port = free_port(), free_port()
    ANSWERED.clear()
    env = {**os.environ, "LEASEHOLD_LOG_LEVEL": "INFO"}
    log_path = tmp_path / "gateway.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "leasehold.cli.main", "gateway", "serve", "--processes", "2", "--database-url", database_url,
            "--pki-dir", str(pki.directory), "--worker-port", str(worker_port), "--operator-port", str(operator_port),
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log)
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    try:
        pids = await pids_serving(ctx, operator_port, 2, 30)
        assert len(pids) == 2 and proc.pid not in pids
        victim = min(pids)
        os.kill(victim, signal.SIGKILL)
        survivors = await pids_serving(ctx, operator_port, 2, 30)
        assert len(survivors) == 2 and victim not in survivors  # a new process took its place
        # /metrics sums every process, the killed one included, whichever process answers.
        counted = set()
        for _ in range(6):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, force_close=True)) as s, \
                    s.get(f"https://localhost:{operator_port}/metrics") as r:
                text = await r.text()
            counted |= {float(line.split()[-1]) for line in text.splitlines()
                        if line.startswith('leasehold_http_requests_total{method="GET",route="/healthz",status="200"}')}
        assert counted == {float(len(ANSWERED))}, (counted, len(ANSWERED))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            raise AssertionError("not stopped within 30 s:\n" + log_path.read_text()[-4000:]) from None
    lines = [orjson.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    restarted = [line for line in lines if line["msg"] == "gateway process died; restarted"]
    assert [(r["dead_pid"], r["how"]) for r in restarted] == [(victim, "signal 9")]
    assert restarted[0]["new_pid"] in survivors
    assert proc.returncode == 0, log_path.read_text()[-3000:]
    assert any(line["msg"] == "stopped" and line["pid"] == proc.pid for line in lines)


async def test_processes_that_cannot_start_stop_the_supervisor(empty_database_url: str, pki: Any) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "leasehold.cli.main", "gateway", "serve", "--processes", "2", "--database-url",
        empty_database_url, "--pki-dir", str(pki.directory), "--worker-port", "0", "--operator-port", "0",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 1
    errors = [line for line in stderr.decode().splitlines() if line.startswith("leasehold: error:")]
    assert len(errors) == 1 and "not migrated" in errors[0]
