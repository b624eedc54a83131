"""``leasehold gateway serve --processes 2``: two processes share the ports (SO_REUSEPORT)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import sys
from typing import Any

import aiohttp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_two_processes_serve_one_port(database_url: str, pki: Any) -> None:
    worker_port, operator_port = free_port(), free_port()
    env = {**os.environ, "LEASEHOLD_LOG_LEVEL": "WARNING"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli.main", "gateway", "serve", "--processes", "2", "--database-url", database_url,
        "--pki-dir", str(pki.directory), "--worker-port", str(worker_port), "--operator-port", str(operator_port),
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    pids: set[int] = set()
    try:
        async with asyncio.timeout(30):
            while len(pids) < 2:
                try:
                    # A fresh connection each time, so the kernel may pick either process.
                    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, force_close=True)) as s, \
                            s.get(f"https://localhost:{operator_port}/healthz") as r:
                        pids.add((await r.json())["pid"])
                except aiohttp.ClientConnectorError:
                    await asyncio.sleep(0.2)
        assert len(pids) == 2 and proc.pid not in pids
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 0, stderr.decode()
