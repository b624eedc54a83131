"""Gateway benchmark: worker lifecycles over HTTPS + mTLS against ``gateway serve --processes P``.

Prints numbers, asserts nothing. In one run, on one server:

1. ``pg_limit``: the yardstick ``../shared/bench/pg_limit.sh`` (the physical limit);
2. the peers ``procrastinate_noop.py`` and ``pgqueuer_noop.py`` (when their packages are
   installed: ``pip install -e '.[bench]'``), each on its own scratch database;
3. ``gateway_lifecycle``: M tasks are queued, then N worker loops drain them over HTTPS with
   client certificates — acquire → one final result batch → complete — through a Gateway of P
   processes; tasks/s, acquire latency p50/p99, and the ratios to 1 and 2;
4. ``long_poll``: a worker waits in acquire; another connection creates a task; the time until
   the worker's answer arrives (p50/p99 over K tries) — NOTIFY wake-up, not a poll tick.

Several leases per request: ``--max-tasks K`` (each acquire asks for up to K leases; a loop
completes them one after the other) and ``--carry-acquire`` (a completion that leaves the loop
without a lease carries the next acquire); ``--modes v1,8,8+carry --rounds 2`` drains once per
mode, alternating, on one Gateway (each on a fresh queue). Each drain prints the requests per
task it measured, the histogram of leases per answer and the load average.

Usage: ``.venv/bin/python bench/gateway_lifecycle.py [--tasks 6000] [--loops 24] [--processes 2]
[--max-tasks K] [--carry-acquire] [--modes M,...] [--rounds R] [--profile]``. It drops and recreates the scratch databases ``leasehold_gw*`` on the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import aiohttp
import orjson
from common import CpuMeter, recreate_database, resolve_server_url
from core_lifecycle import DEFAULT_YARDSTICK_DIR, percentile, run_pg_limit, server_counters

from leasehold.cli.dev_ca import init_pki, issue_worker_certificate
from leasehold.domain.results import payload_sha256
from leasehold.gateway.commands.lifecycle import Lifecycle, TaskSpec
from leasehold.gateway.commands.scans import Scans
from leasehold.gateway.services import build_services
from leasehold.migrations import runner as migrate
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database
from leasehold.worker.client import client_ssl_context

RECORDS = [{"type": "asset", "kind": "service", "value": "127.0.0.1:443/tcp"}]
SHA = payload_sha256(RECORDS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_peer(script: Path, url: str, args: list[str]) -> int | None:
    """jobs/s of a peer's script, or None when its package is not installed."""
    out = subprocess.run([sys.executable, str(script), url, *args], capture_output=True, text=True, check=False)
    match = re.search(r"jobs_per_s=(\d+)", out.stdout)
    if match is None:
        print(f"# {script.name} did not run: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
        return None
    return int(match.group(1))


class GatewayProcess:
    """``leasehold gateway serve`` as a subprocess."""

    def __init__(self, url: str, pki_dir: Path, processes: int, profile: Path | None) -> None:
        self.worker_port, self.operator_port = free_port(), free_port()
        cmd = [sys.executable]
        if profile is not None:
            cmd += ["-m", "cProfile", "-o", str(profile)]
        cmd += ["-m", "leasehold.cli.main", "gateway", "serve", "--database-url", url, "--pki-dir", str(pki_dir),
                "--worker-port", str(self.worker_port), "--operator-port", str(self.operator_port),
                "--processes", str(processes), "--pool-size", "12", "--log-level", "WARNING",
                "--rate-limit-per-second", "100000", "--rate-limit-burst", "100000"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    async def ready(self, ca: Path) -> None:
        ctx = ssl.create_default_context(cafile=str(ca))
        async with asyncio.timeout(60):
            while True:
                try:
                    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, \
                            s.get(f"https://localhost:{self.operator_port}/readyz") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Worker:
    def __init__(self, base: str, ctx: ssl.SSLContext, limit: int) -> None:
        self.base = base
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=limit))

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.session.post(self.base + path, data=orjson.dumps(body),
                                     headers={"Content-Type": "application/json"}) as r:
            raw = await r.read()
            return r.status, (orjson.loads(raw) if raw else None)


async def setup(url: str, pki_dir: Path, workers: int, tasks: int, scans: int) -> tuple[list[Path], Lifecycle,
                                                                                        Scans, Any]:
    pool = create_pool(url, min_size=4, max_size=16)
    await pool.open()
    services = build_services(Database(pool))
    registry, lifecycle = services.registry, services.lifecycle
    org = await registry.create_organization("bench")
    certs = []
    for i in range(workers):
        cert = issue_worker_certificate(pki_dir, f"bench-{i}")
        wid = await registry.register_worker(name=f"bench-{i}", fingerprint=cert.fingerprint, task_types=("probe",),
                                             max_concurrent_tasks=64)
        await registry.assign_worker(wid, org)
        certs.append(cert.cert_path)
    await queue_tasks(lifecycle, services.scans, org, tasks, scans)
    return certs, lifecycle, services.scans, (pool, org)


async def queue_tasks(lifecycle: Lifecycle, scans: Scans, org: UUID, tasks: int, scan_count: int) -> None:
    """``tasks`` tasks, spread over ``scan_count`` new scans."""
    scan_ids = [await scans.create_scan(org, {"targets": ["bench"]}) for _ in range(scan_count)]
    spec = TaskSpec(task_type="probe", scope={"targets": ["192.0.2.10"]}, lease_seconds=60,
                    execution_timeout_seconds=600)
    sem = asyncio.Semaphore(8)

    async def create(i: int) -> None:
        async with sem:
            await lifecycle.create_task(scan_ids[i % scan_count], spec)

    await asyncio.gather(*(create(i) for i in range(tasks)))


async def settled(server: str, dbname: str) -> dict[str, int]:
    """``dbname``'s pg_stat_database counters once every backend has flushed its statistics: an
    idle backend flushes within 10 s, so this waits 11 s (only with ``--db-counters``)."""
    await asyncio.sleep(11)
    return await asyncio.to_thread(server_counters, server, dbname)


def load_average() -> str:
    """The box's load average (1, 5, 15 minutes) now: the benchmark shares it."""
    return "/".join(Path("/proc/loadavg").read_text().split()[:3])


@dataclass(frozen=True)
class Mode:
    """How the worker loops acquire: ``max_tasks`` leases per acquire (None: a one-task acquire,
    the protocol's first version, without the field), and whether each completion carries the
    next acquire (``carry``) when the loop has no lease left."""

    max_tasks: int | None = None
    carry: bool = False

    @property
    def name(self) -> str:
        return ("v1" if self.max_tasks is None else f"max{self.max_tasks}") + ("+carry" if self.carry else "")

    @classmethod
    def parse(cls, text: str) -> Mode:
        """``8``, ``8+carry``, ``1+carry`` or ``v1`` (one task, no new field)."""
        count, _, extra = text.partition("+")
        if extra not in ("", "carry"):
            raise argparse.ArgumentTypeError(f"unknown mode {text!r}: N, N+carry or v1")
        return cls(None if count == "v1" else int(count), extra == "carry")


async def drain(workers: list[Worker], loops: int, tasks: int, step_by_step: bool = False,
                mode: Mode = Mode()) -> dict[str, Any]:
    """Run ``loops`` worker loops until the queue is empty (204) or ``tasks`` completed here: each
    task is acquire -> complete carrying the final batch (as the worker agent does), or with
    ``step_by_step`` acquire -> results (final) -> complete. With ``mode``, an acquire asks for
    up to ``max_tasks`` leases (the loop completes them one after the other), and a completion
    that leaves the loop without a lease carries the next acquire."""
    done = requests = 0
    latencies: list[float] = []
    errors: dict[str, int] = {}
    sizes: dict[int, int] = {}  # leases per answer (acquire answers, and carried ones) -> answers

    def leases_of(body: dict[str, Any]) -> list[dict[str, Any]]:
        if body.get("leases") is not None:
            return list(body["leases"])
        return [body["lease"]] if body.get("lease") else []

    async def loop(w: Worker) -> None:
        nonlocal done, requests
        pending: list[dict[str, Any]] = []
        while done < tasks:
            if not pending:
                request: dict[str, Any] = {"wait_seconds": 0}
                if mode.max_tasks is not None:
                    request["max_tasks"] = mode.max_tasks
                t0 = time.perf_counter()
                status, body = await w.post("/v1/tasks/acquire", request)
                latencies.append(time.perf_counter() - t0)
                requests += 1
                if status == 204:
                    return
                pending = leases_of(body) if status == 200 else []
                if not pending:
                    errors[f"acquire {status}"] = errors.get(f"acquire {status}", 0) + 1
                    continue
                sizes[len(pending)] = sizes.get(len(pending), 0) + 1
            lease = pending.pop(0)
            base = f"/v1/tasks/{lease['task']['id']}/attempts/{lease['attempt_id']}"
            token = lease["lease_token"]
            batch = {"sequence_number": 1, "idempotency_key": "final", "payload_sha256": SHA, "payload": RECORDS}
            complete: dict[str, Any] = {"lease_token": token, "final_batch": batch}
            if step_by_step:
                status, _ = await w.post(base + "/results", {"lease_token": token, **batch, "final": True})
                requests += 1
                if status != 200:
                    errors[f"results {status}"] = errors.get(f"results {status}", 0) + 1
                    continue
                complete = {"lease_token": token}
            carried = mode.carry and not pending and done + 1 < tasks
            if carried:
                complete["acquire"] = {"max_tasks": mode.max_tasks or 1}
            status, body = await w.post(base + "/complete", complete)
            requests += 1
            if status == 200:
                done += 1
                if carried:
                    pending = leases_of(body)
                    if pending:
                        sizes[len(pending)] = sizes.get(len(pending), 0) + 1
            else:
                errors[f"complete {status}"] = errors.get(f"complete {status}", 0) + 1

    await asyncio.gather(*(loop(workers[i % len(workers)]) for i in range(loops)))
    return {"tasks": done, "latencies": latencies, "errors": errors, "requests": requests, "sizes": sizes}


def _drain_process(base: str, ca: str, certs: list[str], loops: int, tasks: int, step_by_step: bool,
                   mode: Mode, start: Any, out: Any) -> None:
    """One client process: its own event loop and sessions (the client is CPU-heavy too)."""

    async def main() -> dict[str, Any]:
        workers = [Worker(base, client_ssl_context(Path(ca), Path(c), Path(c).with_name(Path(c).stem + "-key.pem")),
                          limit=max(1, loops // len(certs) + 1)) for c in certs]
        try:
            start.wait()
            return await drain(workers, loops, tasks, step_by_step, mode)
        finally:
            for w in workers:
                await w.session.close()

    out.put(asyncio.run(main()))


def drain_in_processes(base: str, ca: Path, certs: list[Path], loops: int, tasks: int,
                       processes: int, step_by_step: bool = False, mode: Mode = Mode()) -> dict[str, Any]:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_drain_process, args=(base, str(ca), [str(c) for c in certs[i::processes]],
                                                      loops // processes, tasks, step_by_step, mode, start, out))
             for i in range(processes)]
    for p in procs:
        p.start()
    time.sleep(2.0)  # let every client process import and build its sessions
    started = time.perf_counter()
    start.set()
    parts = [out.get() for _ in procs]
    elapsed = time.perf_counter() - started
    for p in procs:
        p.join()
    done = sum(part["tasks"] for part in parts)
    latencies = [x for part in parts for x in part["latencies"]]
    errors: dict[str, int] = {}
    sizes: dict[int, int] = {}
    for part in parts:
        for k, v in part["errors"].items():
            errors[k] = errors.get(k, 0) + v
        for n, count in part["sizes"].items():
            sizes[n] = sizes.get(n, 0) + count
    requests = sum(part["requests"] for part in parts)
    return {"mode": mode.name, "tasks": done, "seconds": round(elapsed, 2), "tasks_per_s": round(done / elapsed),
            "acquire_p50_ms": round(percentile(latencies, 50) * 1000, 2),
            "acquire_p99_ms": round(percentile(latencies, 99) * 1000, 2), "errors": errors,
            "client_processes": processes, "requests": requests,
            "requests_per_task": round(requests / max(done, 1), 3),
            "leases_per_answer": dict(sorted(sizes.items()))}


def cpu_per_task(used: dict[str, float], tasks: int) -> dict[str, float]:
    """CPU milliseconds per task from a :class:`common.CpuMeter` reading over the drain: the box,
    the Gateway processes, the HTTPS client processes (reaped children of this one), PostgreSQL."""
    n = max(tasks, 1)
    return {"box": round(used["box"] / n * 1e3, 2), "gateway": round(used["gateway"] / n * 1e3, 2),
            "clients": round(used["children"] / n * 1e3, 2), "postgres": round(used["postgres"] / n * 1e3, 2),
            "other": round((used["other"] + used["self"]) / n * 1e3, 2),
            "box_cores_busy": round(used["box"] / used["elapsed"], 2)}


def ceiling(cpu: dict[str, float], results: dict[str, Any]) -> dict[str, Any]:
    """What the box's cores allow: tasks/s if PostgreSQL's share were the only CPU spent (no
    Gateway, no TLS, no clients), and each peer's whole CPU budget per job at its measured rate."""
    cores = os.cpu_count() or 1
    out: dict[str, Any] = {"cores": cores}
    if cpu["postgres"] > 0:
        out["tasks_per_s_if_only_postgres"] = round(cores * 1e3 / cpu["postgres"])
    for name in ("procrastinate", "pgqueuer"):
        if results.get(name):
            out[f"{name}_cpu_budget_ms_per_job"] = round(cores * 1e3 / results[name], 2)
    return out


async def long_poll(worker: Worker, lifecycle: Lifecycle, scans: Scans, org: UUID,
                    tries: int) -> dict[str, float]:
    delays = []
    spec = TaskSpec(task_type="probe", lease_seconds=60, execution_timeout_seconds=600)
    for _ in range(tries):
        waiting = asyncio.create_task(worker.post("/v1/tasks/acquire", {"wait_seconds": 10}))
        await asyncio.sleep(0.05)  # the acquire is now waiting on the Gateway
        scan = await scans.create_scan(org, {"targets": ["long-poll"]})  # a scan per try: it ends
        t0 = time.perf_counter()
        await lifecycle.create_task(scan, spec)
        status, body = await waiting
        delays.append(time.perf_counter() - t0)
        if status == 200 and body["lease"]:
            lease = body["lease"]
            await lifecycle.request_cancel(UUID(lease["task"]["id"]))
            base = f"/v1/tasks/{lease['task']['id']}/attempts/{lease['attempt_id']}"
            await worker.post(base + "/cancel-ack", {"lease_token": lease["lease_token"]})
    return {"tries": tries, "p50_ms": round(percentile(delays, 50) * 1000, 2),
            "p99_ms": round(percentile(delays, 99) * 1000, 2)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server, source = resolve_server_url(args.database_url)
    print(f"# server: {source}")
    results: dict[str, Any] = {}
    if not args.skip_yardsticks:
        results["pg_limit"] = run_pg_limit(args.yardstick_dir, recreate_database(server, f"{args.scratch_prefix}_limit"),
                                           8, args.limit_seconds)
        print(f"pg_limit clients=8 lifecycles_per_s={results['pg_limit']}")
        results["procrastinate"] = run_peer(args.yardstick_dir / "procrastinate_noop.py",
                                            recreate_database(server, f"{args.scratch_prefix}_proc"),
                                            [str(args.tasks), "10", "2"])
        print(f"procrastinate jobs_per_s={results['procrastinate']}")
        results["pgqueuer"] = run_peer(args.yardstick_dir / "pgqueuer_noop.py",
                                       recreate_database(server, f"{args.scratch_prefix}_pgq"), [str(args.tasks), "10", "2"])
        print(f"pgqueuer batch=10 jobs_per_s={results['pgqueuer']}")
    url = recreate_database(server, args.scratch_prefix)
    migrate.upgrade(url)
    with tempfile.TemporaryDirectory() as tmp:
        pki = init_pki(Path(tmp) / "pki")
        certs, lifecycle, scans, (pool, org) = await setup(url, pki.directory, args.workers, args.tasks,
                                                              args.scans)
        profile = Path(args.profile) if args.profile else None
        gateway = GatewayProcess(url, pki.directory, 1 if profile else args.processes, profile)
        base = f"https://localhost:{gateway.worker_port}"
        workers = [Worker(base, client_ssl_context(pki.ca_cert, c, c.with_name(c.stem + "-key.pem")),
                          limit=max(1, args.loops // len(certs) + 1)) for c in certs]
        try:
            await gateway.ready(pki.ca_cert)
            modes = args.modes or [Mode(args.max_tasks, args.carry_acquire)]
            runs: list[dict[str, Any]] = []
            for n, mode in enumerate(modes * args.rounds):
                if n:  # every drain after the first gets a queue of its own, as large
                    await queue_tasks(lifecycle, scans, org, args.tasks, args.scans)
                before = await settled(server, args.scratch_prefix) if args.db_counters else None
                meter = CpuMeter({"gateway": gateway.proc.pid})
                g = await asyncio.to_thread(
                    drain_in_processes, base, pki.ca_cert, certs, args.loops, args.tasks, args.client_processes,
                    args.step_by_step, mode)
                g["cpu_ms_per_task"] = cpu_per_task(meter.stop(), g["tasks"])
                g["loadavg"] = load_average()
                if before is not None:
                    after = await settled(server, args.scratch_prefix)
                    g["db_per_task"] = {("wal_bytes" if k == "wal_lsn" else k): round((after[k] - before[k])
                                                                                    / max(g["tasks"], 1), 2)
                                        for k in after}
                runs.append(g)
                extra = "" if mode == Mode() else (
                    f"mode={mode.name} requests_per_task_measured={g['requests_per_task']} "
                    f"leases_per_answer={json.dumps(g['leases_per_answer'], separators=(',', ':'))} ")
                print(f"gateway_lifecycle processes={1 if profile else args.processes} loops={args.loops} "
                      f"client_processes={args.client_processes} "
                      f"requests_per_task={3 if args.step_by_step else 2} {extra}"
                      f"tasks={g['tasks']} tasks_per_s={g['tasks_per_s']} acquire_p50_ms={g['acquire_p50_ms']} "
                      f"acquire_p99_ms={g['acquire_p99_ms']} errors={g['errors']} loadavg={g['loadavg']}")
                for name in ("pg_limit", "procrastinate", "pgqueuer"):
                    if results.get(name):
                        print(f"ratio_to_{name}={g['tasks_per_s'] / results[name]:.2f} mode={mode.name}")
                print("gateway_lifecycle_cpu_ms_per_task "
                      + " ".join(f"{k}={v}" for k, v in g["cpu_ms_per_task"].items())
                      + f" mode={mode.name} (CPU of the whole box per completed task, and who spent it)")
                if "db_per_task" in g:
                    print(f"gateway_lifecycle_db_per_task mode={mode.name} "
                          + " ".join(f"{k}={v}" for k, v in g["db_per_task"].items())
                          + " (the database's counters per completed task: transactions, rows, WAL)")
            g = results["gateway"] = runs[0]
            if len(runs) > 1:
                results["modes"] = runs
            results["ceiling"] = ceiling(g["cpu_ms_per_task"], results)
            print("ceiling " + " ".join(f"{k}={v}" for k, v in results["ceiling"].items()))
            results["long_poll"] = await long_poll(workers[0], lifecycle, scans, org, args.long_poll_tries)
            lp = results["long_poll"]
            print(f"long_poll_wakeup tries={lp['tries']} p50_ms={lp['p50_ms']} p99_ms={lp['p99_ms']}")
        finally:
            for w in workers:
                await w.session.close()
            gateway.stop()
            await pool.close()
        if profile is not None:
            import pstats

            print("# profile of the Gateway process (top 25 by cumulative time):")
            pstats.Stats(str(profile)).sort_stats("cumulative").print_stats(25)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", help="maintenance URL of the server (default: BENCH_DATABASE_URL, the "
                                          "machine's 127.0.0.1:5432, else the embedded server)")
    p.add_argument("--tasks", type=int, default=6000)
    p.add_argument("--loops", type=int, default=24, help="concurrent worker loops")
    p.add_argument("--workers", type=int, default=8, help="worker certificates the loops share")
    p.add_argument("--scans", type=int, default=64, help="scans the queued tasks are spread over")
    p.add_argument("--processes", type=int, default=2, help="Gateway processes")
    p.add_argument("--client-processes", type=int, default=2,
                   help="processes running the worker loops (one Python process cannot drive the Gateway)")
    p.add_argument("--long-poll-tries", type=int, default=100)
    p.add_argument("--limit-seconds", type=int, default=10)
    p.add_argument("--yardstick-dir", type=Path, default=DEFAULT_YARDSTICK_DIR)
    p.add_argument("--skip-yardsticks", action="store_true")
    p.add_argument("--step-by-step", action="store_true",
                   help="three requests a task (results, then complete) instead of complete carrying the batch")
    p.add_argument("--max-tasks", type=int, default=None, metavar="K",
                   help="each acquire asks for up to K leases (max_tasks); default: the one-task acquire")
    p.add_argument("--carry-acquire", action="store_true",
                   help="a completion that leaves a loop without a lease carries the next acquire")
    p.add_argument("--modes", type=lambda text: [Mode.parse(m) for m in text.split(",")], default=None,
                   metavar="M,M,...",
                   help="drain once per mode, in turn, on one Gateway (v1, N or N+carry, e.g. v1,8,8+carry); "
                        "each drain after the first on a fresh queue of --tasks")
    p.add_argument("--db-counters", action="store_true",
                   help="also print each drain's transactions, rows and WAL per task (pg_stat_database; waits "
                        "11 s before and after each drain for the statistics to settle)")
    p.add_argument("--rounds", type=int, default=1, help="repeat the --modes sequence (alternating) R times")
    p.add_argument("--profile", metavar="FILE", help="run one Gateway process under cProfile, write FILE")
    p.add_argument("--scratch-prefix", default="leasehold_gw",
                   help="names of the scratch databases it drops and recreates (default leasehold_gw)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    results = asyncio.run(run(args))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
