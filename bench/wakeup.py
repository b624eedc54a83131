"""Cross-replica wake-up: how fast a worker long-polling on Gateway B gets a task created through
Gateway A's operator API. Prints numbers, asserts nothing.

Two ``leasehold gateway serve`` processes on one scratch database (``leasehold_wakeup``, dropped
and recreated), each with its own ports. Each try parks one acquire (``wait_seconds`` 10) on B,
waits until B's ``/metrics`` shows it waiting, creates a task through A (``POST
/v1/scans/{id}/tasks``, one kept-alive operator connection), and measures from the create's
answer to the acquire's answer. Paths:

* ``notify``: PostgreSQL LISTEN/NOTIFY (no Redis);
* ``redis_hint``: B does not LISTEN (``--no-listen``); only the Redis hint can wake it
  (A and B both have ``--redis-url``). Runs when ``--redis-url`` is given, or when a private
  ``redis-server`` can be started (``--no-redis`` skips it).

B's ``--poll-interval-seconds`` (default 5) is far above a wake-up, so a poll tick does not
blur the numbers. Usage: ``.venv/bin/python bench/wakeup.py [--tries 100] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from common import recreate_database, resolve_server_url
from core_lifecycle import percentile
from gateway_lifecycle import free_port

from leasehold.cli.dev_ca import init_pki, issue_worker_certificate
from leasehold.gateway.commands.lifecycle import TaskSpec
from leasehold.gateway.services import build_services
from leasehold.gateway.tls import PkiPaths
from leasehold.migrations import runner as migrate
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database
from leasehold.worker.client import client_ssl_context


class Gateway:
    """``leasehold gateway serve`` (one process) with extra settings."""

    def __init__(self, url: str, pki: PkiPaths, admin_key: str, **settings: Any) -> None:
        self.pki, self.worker_port, self.operator_port = pki, free_port(), free_port()
        cmd = [sys.executable, "-m", "leasehold.cli.main", "gateway", "serve", "--database-url", url,
               "--pki-dir", str(pki.directory), "--worker-port", str(self.worker_port),
               "--operator-port", str(self.operator_port), "--log-level", "WARNING"]
        for name, value in settings.items():
            flag = name.replace("_", "-")
            if str(value).lower() in ("true", "false"):  # on/off settings are flag pairs
                cmd.append(f"--{flag}" if str(value).lower() == "true" else f"--no-{flag}")
            else:
                cmd += ["--" + flag, str(value)]
        env = {**os.environ, "LEASEHOLD_ADMIN_API_KEY": admin_key}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.ctx = ssl.create_default_context(cafile=str(pki.ca_cert))

    async def get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ctx)) as s, \
                s.get(f"https://localhost:{self.operator_port}{path}") as r:
            return r.status, await r.text()

    async def ready(self, *, listening: bool) -> None:
        async with asyncio.timeout(60):
            while True:
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    status, text = await self.get("/readyz")
                    if status == 200 and (orjson.loads(text)["listening"] or not listening):
                        return
                await asyncio.sleep(0.1)

    async def waiting(self, at_least: int) -> bool:
        """Whether ``at_least`` acquires are parked in this process."""
        _, text = await self.get("/metrics")
        return next(float(line.split()[1]) for line in text.splitlines()
                    if line.startswith("leasehold_long_polls_waiting ")) >= at_least

    async def redis_connected(self) -> bool:
        return bool(orjson.loads((await self.get("/readyz"))[1])["redis"] == "connected")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def until(condition: Callable[[], Awaitable[bool]], within: float) -> None:
    async with asyncio.timeout(within):
        while True:
            if await condition():
                return
            await asyncio.sleep(0.01)


async def measure(a: Gateway, b: Gateway, url: str, pki: PkiPaths, admin_key: str, tries: int) -> dict[str, Any]:
    """``tries`` wake-ups of a worker waiting on ``b`` by tasks created through ``a``."""
    pool = create_pool(url, min_size=1, max_size=4)
    await pool.open()
    services = build_services(Database(pool))
    registry, lifecycle, scans = services.registry, services.lifecycle, services.scans
    org = await registry.create_organization(f"wakeup-{secrets.token_hex(4)}")
    scan = await scans.create_scan(org, {"targets": ["192.0.2.10"]})
    # A job no worker takes keeps the scan open for every try's task.
    await lifecycle.create_task(scan, TaskSpec(task_type="hold", lease_seconds=60, execution_timeout_seconds=600))
    name = f"wakeup-{secrets.token_hex(4)}"
    cert = issue_worker_certificate(pki.directory, name)
    worker_id = await registry.register_worker(name=name, fingerprint=cert.fingerprint, task_types=("probe",),
                                               max_concurrent_tasks=tries + 1)
    await registry.assign_worker(worker_id, org)
    worker = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
        ssl=client_ssl_context(pki.ca_cert, cert.cert_path, cert.key_path)))
    operator = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=a.ctx),
                                     headers={"Authorization": f"Bearer {admin_key}"})
    body = orjson.dumps({"task_type": "probe", "lease_seconds": 60, "execution_timeout_seconds": 600})
    latencies: list[float] = []

    async def acquire() -> tuple[int, float]:
        async with worker.post(f"https://localhost:{b.worker_port}/v1/tasks/acquire",
                               data=orjson.dumps({"wait_seconds": 10}),
                               headers={"Content-Type": "application/json"}) as r:
            await r.read()
            return r.status, time.perf_counter()

    try:
        for _ in range(tries):
            waiting = asyncio.create_task(acquire())
            await until(lambda: b.waiting(1), 10)
            async with operator.post(f"https://localhost:{a.operator_port}/v1/scans/{scan}/tasks", data=body,
                                     headers={"Content-Type": "application/json"}) as r:
                await r.read()
                assert r.status == 201, r.status
                created = time.perf_counter()
            status, answered = await waiting
            assert status == 200, status
            latencies.append(answered - created)
    finally:
        await worker.close()
        await operator.close()
        await pool.close()
    return {"tries": tries, "p50_ms": round(percentile(latencies, 50) * 1000, 2),
            "p99_ms": round(percentile(latencies, 99) * 1000, 2), "max_ms": round(max(latencies) * 1000, 2)}


async def run_path(path: str, url: str, pki: PkiPaths, tries: int, poll: float,
                   redis_url: str | None) -> dict[str, Any]:
    admin_key = secrets.token_hex(16)
    a_settings: dict[str, Any] = {"redis_url": redis_url} if redis_url else {}
    b_settings: dict[str, Any] = {"poll_interval_seconds": poll, **a_settings}
    if path == "redis_hint":
        b_settings["listen"] = "false"
    a, b = Gateway(url, pki, admin_key, **a_settings), Gateway(url, pki, admin_key, **b_settings)
    try:
        await a.ready(listening=True)
        await b.ready(listening=path != "redis_hint")
        if redis_url:
            await until(b.redis_connected, 15)
        result = await measure(a, b, url, pki, admin_key, tries)
    finally:
        a.stop()
        b.stop()
    print(f"wakeup path={path} tries={result['tries']} p50_ms={result['p50_ms']} p99_ms={result['p99_ms']} "
          f"max_ms={result['max_ms']} poll_interval_s={poll}")
    return result


@contextlib.contextmanager
def private_redis(directory: Path) -> Any:
    """A ``redis-server`` of this run (no persistence), or None when it is not installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server, source = resolve_server_url(args.database_url)
    print(f"# server: {source}")
    url = recreate_database(server, args.scratch_name)
    migrate.upgrade(url)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        pki = init_pki(Path(tmp) / "pki")
        results["notify"] = await run_path("notify", url, pki, args.tries, args.poll_interval_seconds, None)
        if not args.no_redis:
            with private_redis(Path(tmp)) if args.redis_url is None else contextlib.nullcontext(args.redis_url) \
                    as redis_url:
                if redis_url is None:
                    print("# redis_hint skipped: no --redis-url and no redis-server on PATH")
                else:
                    results["redis_hint"] = await run_path("redis_hint", url, pki, args.tries,
                                                           args.poll_interval_seconds, redis_url)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", help="maintenance URL of the server (default: BENCH_DATABASE_URL, the "
                                          "machine's 127.0.0.1:5432, else the embedded server)")
    p.add_argument("--tries", type=int, default=100)
    p.add_argument("--poll-interval-seconds", type=float, default=5.0, help="Gateway B's safety poll")
    p.add_argument("--redis-url", help="use this Redis for the redis_hint path (default: a private redis-server)")
    p.add_argument("--no-redis", action="store_true", help="measure the notify path only")
    p.add_argument("--scratch-name", default="leasehold_wakeup",
                   help="the scratch database it drops and recreates (default leasehold_wakeup)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    results = asyncio.run(run(args))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
