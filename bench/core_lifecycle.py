"""Core lifecycle benchmark: the service layer (no HTTP) against the physical limit of the server.

Prints numbers, asserts nothing. Sections (each can be skipped):

1. ``pg_limit``: the read-only yardstick ``../shared/bench/pg_limit.sh`` on the scratch database
   ``leasehold_bench_limit``, in the same run, on the same server.
2. ``core_lifecycle``: lifecycles/s of ``create_task -> acquire -> submit_batch(final) -> complete``
   through :class:`gateway.commands.Lifecycle` on ``leasehold_bench``, C asyncio loops over one pool
   per process, with 1 process and with P processes. Every loop has its own organisation and
   worker, and every lifecycle its own one-job scan created beforehand (a scan finishes when its
   only job does, so the same scan cannot take a second job; see ``bench/README.md``).
3. ``cost``: per lifecycle and per command, measured on the wire by an in-process TCP relay that
   parses the PostgreSQL protocol (round trips, Execute/Sync messages, CommandComplete tags), and
   cross-checked with ``pg_stat_database`` (xact_commit, tuples) and the WAL position.
4. ``history``: acquire latency (one worker, sequential) on a freshly migrated database, then the
   same after bulk-loading N completed tasks with their attempts, batches, payloads, scans and
   events in SQL (``INSERT ... SELECT generate_series``) and ``VACUUM ANALYZE``.

Usage: ``.venv/bin/python bench/core_lifecycle.py [--seconds 15] [--concurrency 8] [--json]``
(``--help`` for everything). It drops and recreates ``leasehold_bench`` and
``leasehold_bench_limit`` on the server: never point it at a server whose databases of those
names matter.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import io
import json
import math
import multiprocessing as mp
import os
import pstats
import re
import secrets
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from common import TICKS, CpuMeter, percentile, recreate_database, resolve_server_url
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from leasehold.cli.embedded import redact_url
from leasehold.domain.events import ProfileStep
from leasehold.domain.results import payload_sha256
from leasehold.domain.task import project_task
from leasehold.gateway.commands.lifecycle import Lifecycle, ResultBatch, TaskSpec
from leasehold.gateway.commands.registry import Registry
from leasehold.gateway.commands.scans import Scans
from leasehold.gateway.services import build_services
from leasehold.migrations import runner as migrate
from leasehold.persistence.connection import connect, create_pool
from leasehold.persistence.event_log import read_stream
from leasehold.persistence.transaction import Database

# Scratch databases (dropped and recreated): --scratch-prefix renames them, e.g. for the suite's smoke run.
BENCH_DB = "leasehold_bench"
LIMIT_DB = "leasehold_bench_limit"
REPLICA_DB = "leasehold_bench_replica"
REPLICA_DIR = Path(__file__).resolve().parent / "sql"
#: "1": the final batch is submitted on its own before complete (4 commands a lifecycle instead of 3,
#: the worker API's step-by-step shape); set from --step-by-step.
STEP_BY_STEP_ENV = "LEASEHOLD_BENCH_STEP_BY_STEP"
#: "1": psycopg prepares nothing on the server (as the Gateway behind a transaction pooler, with
#: --no-prepared-statements); set from --no-prepared-statements.
NO_PREPARE_ENV = "LEASEHOLD_BENCH_NO_PREPARE"
DEFAULT_YARDSTICK_DIR = Path(__file__).resolve().parents[2] / "shared" / "bench"
TASK_TYPE = "probe"
SPEC = TaskSpec(task_type=TASK_TYPE, scope={"host": "bench.example.test"}, lease_seconds=60,
                execution_timeout_seconds=600)
STEPS = ("create_task", "acquire", "submit_batch", "complete")
#: Jobs per scan in the bulk-loaded history (and in the acquire-latency backlog).
HISTORY_JOBS_PER_SCAN = 10
ACQUIRE_WARMUP = 50


def log(message: str) -> None:
    print(f"[core_lifecycle {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- who used the CPU


class CpuWindow:
    """Cores used between ``start()`` and ``stop()`` by the whole box, by this benchmark (``root``
    and its process tree), by PostgreSQL and by everything else (see :class:`common.CpuMeter`);
    ``other_cores`` well above 0 says something else was loading the box."""

    def __init__(self, root: int) -> None:
        self.meter = CpuMeter({"bench": root})

    def start(self) -> None:
        self.meter.start()

    def stop(self) -> dict[str, float]:
        used = self.meter.stop()
        bench = used["bench"] + used["self"] + used["children"]
        return {f"{k}_cores": round(v / used["elapsed"], 2)
                for k, v in (("box", used["box"]), ("bench", bench), ("postgres", used["postgres"]),
                             ("other", used["other"]))}


# --------------------------------------------------------------------------- server and databases


def fresh_bench_database(server_url: str) -> str:
    url = recreate_database(server_url, BENCH_DB)
    migrate.upgrade(url)
    return url


def vacuum_analyze(url: str) -> float:
    """``VACUUM ANALYZE``, then a ``CHECKPOINT`` so that what follows does not compete with the
    write-back of what came before (skipped where the role may not checkpoint); seconds taken."""
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        try:
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            pass
    return time.perf_counter() - started


def wal_lsn(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").fetchone()
    assert row is not None
    return int(row[0])


# --------------------------------------------------------------------------- 1. the physical limit


def run_pg_limit(yardstick_dir: Path, url: str, clients: int, seconds: int) -> int:
    script = yardstick_dir / "pg_limit.sh"
    if not script.is_file():
        raise SystemExit(f"yardstick not found: {script} (use --yardstick-dir)")
    out = subprocess.run(["bash", str(script), url, str(clients), str(seconds)], capture_output=True,
                         text=True, check=False)
    match = re.search(r"lifecycles_per_s=(\d+)", out.stdout)
    if out.returncode != 0 or match is None:
        raise SystemExit(f"pg_limit.sh failed (rc={out.returncode}):\n{out.stdout}\n{out.stderr}")
    return int(match.group(1))


def run_replica(server_url: str, clients: int, seconds: int) -> int:
    """The pure-SQL replica of our own lifecycle (``bench/sql/replica_lifecycle.sql``) with pgbench on
    a freshly migrated scratch database: what PostgreSQL alone needs for our statements and rows."""
    url = recreate_database(server_url, REPLICA_DB)
    migrate.upgrade(url)
    scans = 4000 * seconds + 10_000  # one pending scan per lifecycle to come, more than it can run
    setup = subprocess.run(["psql", url, "-q", "-v", "ON_ERROR_STOP=1", "-v", f"clients={clients}", "-v",
                            f"scans={scans}", "-f", str(REPLICA_DIR / "replica_setup.sql")],
                           capture_output=True, text=True, check=False)
    if setup.returncode != 0:
        raise SystemExit(f"replica set-up failed:\n{setup.stderr}")
    out = subprocess.run(["pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
                          "-T", str(seconds), "-f", str(REPLICA_DIR / "replica_lifecycle.sql"), url],
                         capture_output=True, text=True, check=False)
    match = re.search(r"^tps = ([0-9.]+)", out.stdout, re.MULTILINE)
    if out.returncode != 0 or match is None:
        raise SystemExit(f"replica pgbench failed (rc={out.returncode}):\n{out.stdout}\n{out.stderr}")
    return int(float(match.group(1)))


def yardstick_statements(yardstick_dir: Path) -> list[tuple[str, bool]]:
    """The yardstick lifecycle as (statement, returns the task id) pairs, psql variables turned
    into psycopg placeholders; read from the script so the two never drift apart."""
    out, pending = [], []
    for line in (yardstick_dir / "pg_limit_lifecycle.sql").read_text().splitlines():
        pending.append(line.strip())
        gset = line.rstrip().endswith("\\gset")
        if not (gset or line.rstrip().endswith(";")):
            continue  # a statement continues on the next line
        text = " ".join(pending).removesuffix("\\gset").strip().rstrip(";")
        pending = []
        out.append((text.replace(":client_id", "%(client_id)s").replace(":tid", "%(tid)s"), gset))
    return out


def pg_limit_backend_cpu(yardstick_dir: Path, url: str, lifecycles: int) -> float | None:
    """CPU ms of the one PostgreSQL backend running the yardstick lifecycle ``lifecycles`` times,
    sequentially on one connection, statements prepared: the same measurement as ours (cost
    section), so the two divide. None when the backend's /proc is not readable."""
    schema = (yardstick_dir / "pg_limit_schema.sql").read_text()
    steps = yardstick_statements(yardstick_dir)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(schema)
        conn.execute("INSERT INTO tasks(payload) SELECT '{}' FROM generate_series(1, %s)", (lifecycles,))
        conn.execute("VACUUM ANALYZE tasks")
        pid = conn.info.backend_pid
        if not Path(f"/proc/{pid}/stat").exists():
            return None
        params: dict[str, Any] = {"client_id": 1, "tid": None}

        def run(n: int) -> None:
            for _ in range(n):
                for statement, gset in steps:
                    cur = conn.execute(statement, params, prepare=True)
                    if gset:
                        row = cur.fetchone()
                        params["tid"] = row[0] if row else None

        run(20)
        cpu0 = backend_cpu(pid)
        run(lifecycles)
        return round((backend_cpu(pid) - cpu0) / lifecycles * 1e3, 3)


# --------------------------------------------------------------------------- 2. throughput


@dataclass
class BenchLoop:
    """One asyncio loop's tenant: its organisation, its worker and its queue of fresh scans."""

    org: UUID
    worker: UUID
    scans: deque[UUID] = field(default_factory=deque)
    refills: int = 0
    misses: int = 0


async def make_loop(registry: Registry, name: str) -> BenchLoop:
    org = await registry.create_organization(name)
    worker = await registry.register_worker(name=name, fingerprint=secrets.token_hex(32),
                                            task_types=(TASK_TYPE,), max_concurrent_tasks=1000)
    await registry.assign_worker(worker, org)
    return BenchLoop(org, worker)


#: The realistic shape: scans of a three-step profile over several targets, each step's task created
#: by orchestration when the previous one completes, each batch one asset record per target.
PROFILE_TARGETS = 4
PROFILE = tuple(ProfileStep(task_type=TASK_TYPE, lease_seconds=60, execution_timeout_seconds=600)
                for _ in range(3))


async def profile_scans(url: str, conc: int, seconds: float, warmup: float) -> dict[str, Any]:
    """``conc`` loops, each running scans of :data:`PROFILE` one after the other for ``seconds``
    (after ``warmup``): acquire, then complete carrying the step's batch; tasks per second."""
    pool = create_pool(url, min_size=conc, max_size=conc, prepare=_prepare())
    await pool.open(wait=True)
    try:
        services = build_services(Database(pool))
        loops = list(await asyncio.gather(*(make_loop(services.registry, f"bench-profile-{i}")
                                            for i in range(conc))))
        targets = [f"10.0.0.{n}" for n in range(1, PROFILE_TARGETS + 1)]
        records = [{"type": "asset", "kind": "host", "value": host} for host in targets]
        final = ResultBatch(1, "final", payload_sha256(records), records)

        async def run(loop: BenchLoop, until: float) -> int:
            tasks = 0
            while time.perf_counter() < until:
                await services.scans.create_scan(loop.org, {"targets": targets}, profile=PROFILE)
                while (a := await services.lifecycle.acquire(loop.worker)) is not None:
                    await services.lifecycle.complete(loop.worker, a.task.id, a.attempt.id, a.lease_token,
                                                      final_batch=final)
                    tasks += 1
            return tasks

        await asyncio.gather(*(run(loop, time.perf_counter() + warmup) for loop in loops))
        await asyncio.to_thread(vacuum_analyze, url)
        cpu0, started = time.process_time(), time.perf_counter()
        tasks = sum(await asyncio.gather(*(run(loop, started + seconds) for loop in loops)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu0
    finally:
        await pool.close()
    return {"tasks": tasks, "seconds": round(elapsed, 2), "tasks_per_s": round(tasks / elapsed, 1),
            "client_cpu_ms_per_task": round(cpu * 1e3 / max(tasks, 1), 3)}


async def new_scan(scans: Scans, loop: BenchLoop) -> UUID:
    return await scans.create_scan(loop.org, {"hosts": ["bench.example.test"]})


async def provision(scans: Scans, loop: BenchLoop, count: int) -> None:
    for _ in range(count):
        loop.scans.append(await new_scan(scans, loop))


def _prepare() -> bool:
    return os.environ.get(NO_PREPARE_ENV) != "1"


async def one_lifecycle(lifecycle: Lifecycle, scans: Scans, loop: BenchLoop,
                        steps: dict[str, list[float]] | None,
                        hook: Callable[[str], None] | None = None) -> None:
    """create_task -> acquire -> complete carrying one final 1-record batch (with --step-by-step the
    batch is submitted on its own first), on a fresh scan."""
    if not loop.scans:
        loop.refills += 1
        loop.scans.append(await new_scan(scans, loop))
    scan = loop.scans.popleft()
    t0 = time.perf_counter()
    task = await lifecycle.create_task(scan, SPEC)
    t1 = time.perf_counter()
    if hook:
        hook("create_task")
    acquired = await lifecycle.acquire(loop.worker)
    while acquired is None:  # cannot happen with one tenant per loop; counted if it does
        loop.misses += 1
        acquired = await lifecycle.acquire(loop.worker)
    t2 = time.perf_counter()
    if hook:
        hook("acquire")
    if acquired.task.id != task.id:
        loop.misses += 1
    records = [{"type": "asset", "kind": "host", "value": f"{acquired.task.id}.bench.example.test"}]
    final = None
    if os.environ.get(STEP_BY_STEP_ENV) != "1":  # the batch travels with complete, as the agent sends it
        final = ResultBatch(1, "final", payload_sha256(records), records)
    else:
        await lifecycle.submit_batch(
            loop.worker, acquired.task.id, acquired.attempt.id, acquired.lease_token, sequence_number=1,
            idempotency_key="final", payload_sha256=payload_sha256(records), records=records, final=True)
    t3 = time.perf_counter()
    if hook:
        hook("submit_batch")
    await lifecycle.complete(loop.worker, acquired.task.id, acquired.attempt.id, acquired.lease_token,
                             final_batch=final)
    t4 = time.perf_counter()
    if hook:
        hook("complete")
    if steps is not None:
        steps["create_task"].append(t1 - t0)
        steps["acquire"].append(t2 - t1)
        steps["submit_batch"].append(t3 - t2)
        steps["complete"].append(t4 - t3)


async def drive(lifecycle: Lifecycle, scans: Scans, loops: list[BenchLoop], seconds: float,
                ) -> tuple[int, float, dict[str, list[float]]]:
    """Run every loop until ``seconds`` have passed; (lifecycles, elapsed, step durations)."""
    steps: dict[str, list[float]] = {name: [] for name in STEPS}
    started = time.perf_counter()
    deadline = started + seconds

    async def run(loop: BenchLoop) -> int:
        done = 0
        while time.perf_counter() < deadline:
            await one_lifecycle(lifecycle, scans, loop, steps)
            done += 1
        return done

    counts = await asyncio.gather(*(run(loop) for loop in loops))
    return sum(counts), time.perf_counter() - started, steps


async def throughput_process(url: str, proc: int, conc: int, seconds: float, warmup: float, tag: str,
                             barrier: Barrier | None, root_pid: int, profiler: cProfile.Profile | None = None,
                             ) -> dict[str, Any]:
    """One process's share of a throughput run: set up, warm up, provision scans, run timed."""
    pool = create_pool(url, min_size=conc, max_size=conc, prepare=_prepare())
    await pool.open(wait=True)
    try:
        db = Database(pool)
        services = build_services(db)
        registry, lifecycle, scans = services.registry, services.lifecycle, services.scans
        loops = list(await asyncio.gather(*(make_loop(registry, f"bench-{tag}-p{proc}-l{i}")
                                            for i in range(conc))))
        if barrier is not None:
            await asyncio.to_thread(barrier.wait)
        warm_n, _, warm_steps = await drive(lifecycle, scans, loops, warmup)
        busy = sum(sum(v) for v in warm_steps.values())
        per_loop_rate = warm_n / busy if busy > 0 else 100.0
        need = math.ceil(per_loop_rate * seconds * 1.5) + 20
        started = time.perf_counter()
        await asyncio.gather(*(provision(scans, loop, need) for loop in loops))
        provision_s = time.perf_counter() - started
        for loop in loops:
            loop.refills = loop.misses = 0
        if proc == 0:  # statistics and visibility as autovacuum would keep them (it may be off)
            await asyncio.to_thread(vacuum_analyze, url)
        if barrier is not None:
            await asyncio.to_thread(barrier.wait)
        window = CpuWindow(root_pid)
        if profiler is not None:
            profiler.enable()
        window.start()
        cpu0 = time.process_time()
        count, elapsed, steps = await drive(lifecycle, scans, loops, seconds)
        cpu = time.process_time() - cpu0
        box = window.stop()
        if profiler is not None:
            profiler.disable()
        return {"lifecycles": count, "elapsed": elapsed, "steps": steps, "cpu_s": cpu, "box": box,
                "refills": sum(loop.refills for loop in loops), "misses": sum(loop.misses for loop in loops),
                "warmup_lifecycles": warm_n, "provisioned_scans": need * conc, "provision_s": provision_s}
    finally:
        await pool.close()


def _process_entry(url: str, proc: int, conc: int, seconds: float, warmup: float, tag: str,
                   barrier: Barrier | None, queue: Any) -> None:
    try:
        queue.put(asyncio.run(throughput_process(url, proc, conc, seconds, warmup, tag, barrier, os.getppid())))
    except BaseException:
        if barrier is not None:
            barrier.abort()
        queue.put({"error": traceback.format_exc()})


def run_throughput(url: str, procs: int, conc: int, seconds: float, warmup: float) -> dict[str, Any]:
    """``procs`` spawned processes, each ``conc`` loops over its own pool; aggregated result."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs, timeout=900) if procs > 1 else None
    queue = ctx.Queue()
    tag = secrets.token_hex(4)
    workers = [ctx.Process(target=_process_entry, args=(url, i, conc, seconds, warmup, tag, barrier, queue))
               for i in range(procs)]
    for w in workers:
        w.start()
    results = [queue.get() for _ in workers]
    for w in workers:
        w.join()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise SystemExit("throughput process failed:\n" + "\n".join(errors))
    total = sum(r["lifecycles"] for r in results)
    elapsed = max(r["elapsed"] for r in results)
    steps: dict[str, list[float]] = {name: [] for name in STEPS}
    for r in results:
        for name in STEPS:
            steps[name].extend(r["steps"][name])
    return {
        "procs": procs, "conc": conc, "seconds": seconds, "lifecycles": total, "elapsed_s": round(elapsed, 3),
        "lifecycles_per_s": round(total / elapsed, 1),
        "client_cpu_s_per_lifecycle_ms": round(sum(r["cpu_s"] for r in results) / max(total, 1) * 1e3, 3),
        "step_ms": {name: {"p50": round(percentile(v, 50) * 1e3, 2), "p99": round(percentile(v, 99) * 1e3, 2),
                           "mean": round(statistics.fmean(v) * 1e3, 2) if v else math.nan}
                    for name, v in steps.items()},
        "lifecycle_ms_mean": round(sum(statistics.fmean(v) for v in steps.values() if v) * 1e3, 2),
        "scan_refills_in_timed_window": sum(r["refills"] for r in results),
        "acquire_misses": sum(r["misses"] for r in results),
        "provisioned_scans": sum(r["provisioned_scans"] for r in results),
        "cpu_cores_during_window": results[0]["box"],
    }


async def paced_latencies(url: str, conc: int, rate: float, seconds: float) -> dict[str, Any]:
    """``conc`` loops sharing ``rate`` lifecycles/s between them (each starts its next lifecycle on a
    fixed schedule, so the offered load does not depend on the answers), for ``seconds``; each
    command's latency as the loop saw it."""
    pool = create_pool(url, min_size=conc, max_size=conc, prepare=_prepare())
    await pool.open(wait=True)
    try:
        db = Database(pool)
        services = build_services(db)
        loops = list(await asyncio.gather(*(make_loop(services.registry, f"bench-paced-{secrets.token_hex(3)}-{i}")
                                            for i in range(conc))))
        per_loop = max(1, math.ceil(rate * seconds / conc)) + 2
        await asyncio.gather(*(provision(services.scans, loop, per_loop) for loop in loops))
        await asyncio.to_thread(vacuum_analyze, url)
        steps: dict[str, list[float]] = {name: [] for name in STEPS}
        interval = conc / rate
        started = time.perf_counter()

        async def run(index: int) -> int:
            due, done = started + index * interval / conc, 0
            while due < started + seconds:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                await one_lifecycle(services.lifecycle, services.scans, loops[index], steps)
                done += 1
                due += interval
            return done

        done = sum(await asyncio.gather(*(run(i) for i in range(conc))))
    finally:
        await pool.close()
    return {"lifecycles": done, "offered_per_s": round(rate, 1),
            "step_ms": {name: {"p50": round(percentile(v, 50) * 1e3, 2), "p99": round(percentile(v, 99) * 1e3, 2)}
                        for name, v in steps.items() if v}}


def profile_throughput(url: str, conc: int, seconds: float, warmup: float, out: Path) -> dict[str, str]:
    """A single-process run in this process under cProfile (timed window only)."""
    profiler = cProfile.Profile()
    asyncio.run(throughput_process(url, 0, conc, seconds, warmup, secrets.token_hex(4), None, os.getpid(),
                                   profiler))
    profiler.dump_stats(str(out))
    tables: dict[str, str] = {}
    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).strip_dirs().sort_stats(key).print_stats(15)
        tables[key] = buf.getvalue()
    return tables


# --------------------------------------------------------------------------- 3. cost on the wire


SSL_REQUEST, GSSENC_REQUEST = 80877103, 80877104


class _Messages:
    """Incremental splitter of one direction of a PostgreSQL protocol v3 stream."""

    def __init__(self, *, startup: bool) -> None:
        self.buf = bytearray()
        self.startup = startup  # the frontend's first message(s) carry no type byte

    def feed(self, data: bytes) -> Iterator[tuple[str, bytes]]:
        buf = self.buf
        buf += data
        while True:
            if self.startup:
                if len(buf) < 8:
                    return
                size = int.from_bytes(buf[0:4], "big")
                if len(buf) < size:
                    return
                code = int.from_bytes(buf[4:8], "big")
                del buf[:size]
                if code not in (SSL_REQUEST, GSSENC_REQUEST):
                    self.startup = False
                yield "startup", b""
                continue
            if len(buf) < 5:
                return
            size = 1 + int.from_bytes(buf[1:5], "big")
            if len(buf) < size:
                return
            kind = chr(buf[0])
            body = bytes(buf[5:size]) if kind == "C" else b""
            del buf[:size]
            yield kind, body


@dataclass
class WireStats:
    """What crossed the relay. A round trip is a client->server burst that follows server data."""

    round_trips: int = 0
    frontend: Counter[str] = field(default_factory=Counter)  # message types: E=Execute, S=Sync, P=Parse…
    tags: Counter[str] = field(default_factory=Counter)  # CommandComplete tags: SELECT, INSERT, COMMIT…
    noop_updates: int = 0  # "UPDATE 0"
    bytes_up: int = 0
    bytes_down: int = 0

    def copy(self) -> WireStats:
        return WireStats(self.round_trips, Counter(self.frontend), Counter(self.tags), self.noop_updates,
                         self.bytes_up, self.bytes_down)

    def minus(self, other: WireStats) -> WireStats:
        return WireStats(self.round_trips - other.round_trips, self.frontend - other.frontend,
                         self.tags - other.tags, self.noop_updates - other.noop_updates,
                         self.bytes_up - other.bytes_up, self.bytes_down - other.bytes_down)

    def add(self, other: WireStats) -> None:
        self.round_trips += other.round_trips
        self.frontend.update(other.frontend)
        self.tags.update(other.tags)
        self.noop_updates += other.noop_updates
        self.bytes_up += other.bytes_up
        self.bytes_down += other.bytes_down

    def statements(self) -> int:
        return self.frontend["E"] + self.frontend["Q"]

    def summary(self, per: int) -> dict[str, Any]:
        return {
            "round_trips": round(self.round_trips / per, 2),
            "statements": round(self.statements() / per, 2),
            "syncs": round(self.frontend["S"] / per, 2),
            "commits": round(self.tags["COMMIT"] / per, 2),
            "begins": round(self.tags["BEGIN"] / per, 2),
            "by_tag": {tag: round(n / per, 2) for tag, n in sorted(self.tags.items())},
            "noop_updates": round(self.noop_updates / per, 2),
            "bytes_up": round(self.bytes_up / per), "bytes_down": round(self.bytes_down / per),
        }


class Relay:
    """A TCP relay in front of the server that counts protocol messages and round trips."""

    def __init__(self, target: dict[str, Any]) -> None:
        self.target = target
        self.stats = WireStats()
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = self.target.get("host") or "/var/run/postgresql", int(self.target.get("port") or 5432)
        if host.startswith("/"):
            return await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        return await asyncio.open_connection(host, port)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await self._open_upstream()
        last = ["down"]
        up, down = _Messages(startup=True), _Messages(startup=False)

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upward: bool) -> None:
            try:
                while data := await reader.read(65536):
                    s = self.stats
                    if upward:
                        if last[0] == "down":
                            s.round_trips += 1
                        last[0] = "up"
                        s.bytes_up += len(data)
                        for kind, _ in up.feed(data):
                            s.frontend[kind] += 1
                    else:
                        last[0] = "down"
                        s.bytes_down += len(data)
                        for kind, body in down.feed(data):
                            if kind == "C":
                                tag = body.rstrip(b"\0").decode()
                                s.tags[tag.split(" ", 1)[0]] += 1
                                if tag == "UPDATE 0":
                                    s.noop_updates += 1
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        await asyncio.gather(pump(client_r, server_w, True), pump(server_r, client_w, False))


def relayed_conninfo(url: str, port: int) -> str:
    params = conninfo_to_dict(url)
    params.pop("hostaddr", None)
    params.update(host="127.0.0.1", port=str(port), sslmode="disable", gssencmode="disable")
    return make_conninfo("", **params)


def server_counters(server_url: str, dbname: str) -> dict[str, int]:
    """pg_stat_database counters of ``dbname`` and the WAL position, read from another database."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted,"
            " pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
            " FROM pg_stat_database WHERE datname = %s", (dbname,)).fetchone()
    assert row is not None
    keys = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted", "wal_lsn")
    return dict(zip(keys, (int(v) for v in row), strict=True))


def settled_counters(server_url: str, dbname: str) -> dict[str, int]:
    """Counters once every backend of ``dbname`` has flushed its statistics (they exited)."""
    last = server_counters(server_url, dbname)
    for _ in range(40):
        time.sleep(0.25)
        now = server_counters(server_url, dbname)
        if {k: v for k, v in now.items() if k != "wal_lsn"} == {k: v for k, v in last.items() if k != "wal_lsn"}:
            return now
        last = now
    return last


def bench_backend_pid(url: str) -> int | None:
    """The pid of the only other client backend connected to the bench database, if its /proc is
    readable (``url`` is any database of the server)."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s"
                            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                            (BENCH_DB,)).fetchall()
    if len(rows) != 1 or not Path(f"/proc/{rows[0][0]}/stat").exists():
        return None
    return int(rows[0][0])


def backend_cpu(pid: int | None) -> float:
    """CPU seconds a local process used so far (0 when unknown); /proc has clock-tick resolution."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


async def measure_cost(server_url: str, url: str, lifecycles: int) -> dict[str, Any]:
    """Sequential lifecycles through the relay, one connection: counts per lifecycle and per command."""
    relay = Relay(conninfo_to_dict(url))
    port = await relay.start()
    relayed = relayed_conninfo(url, port)
    warm = 20
    try:
        setup = create_pool(relayed, min_size=1, max_size=1, prepare=_prepare())
        await setup.open(wait=True)
        services = build_services(Database(setup))
        registry, lifecycle, scans = services.registry, services.lifecycle, services.scans
        loop = await make_loop(registry, f"bench-cost-{secrets.token_hex(4)}")
        await provision(scans, loop, warm + lifecycles)
        for _ in range(warm):
            await one_lifecycle(lifecycle, scans, loop, None)
        await setup.close()  # its backend exits, so its statistics are flushed
        await asyncio.to_thread(vacuum_analyze, url)
        before_db = await asyncio.to_thread(settled_counters, server_url, BENCH_DB)

        pool = create_pool(relayed, min_size=1, max_size=1, prepare=_prepare())
        await pool.open(wait=True)
        backend = await asyncio.to_thread(bench_backend_pid, server_url)
        services = build_services(Database(pool))
        registry, lifecycle, scans = services.registry, services.lifecycle, services.scans
        per_command = {name: WireStats() for name in STEPS}
        server_cpu = dict.fromkeys(STEPS, 0.0)
        mark = [relay.stats.copy()]
        cpu_mark = [backend_cpu(backend)]

        def hook(step: str) -> None:
            now, cpu = relay.stats.copy(), backend_cpu(backend)
            per_command[step].add(now.minus(mark[0]))
            server_cpu[step] += cpu - cpu_mark[0]
            mark[0], cpu_mark[0] = now, cpu

        start, cpu_start = relay.stats.copy(), backend_cpu(backend)
        for _ in range(lifecycles):
            mark[0], cpu_mark[0] = relay.stats.copy(), backend_cpu(backend)
            await one_lifecycle(lifecycle, scans, loop, None, hook)
        total = relay.stats.minus(start)
        cpu_total = backend_cpu(backend) - cpu_start
        await pool.close()
        after_db = await asyncio.to_thread(settled_counters, server_url, BENCH_DB)
    finally:
        await relay.close()
    db = {k: (after_db[k] - before_db[k]) / lifecycles for k in after_db}
    readable = backend is not None
    return {
        "lifecycles": lifecycles,
        "wire": total.summary(lifecycles),
        "backend_cpu_ms": round(cpu_total / lifecycles * 1e3, 3) if readable else None,
        "per_command": {name: {**s.summary(lifecycles),
                               "backend_cpu_ms": round(server_cpu[name] / lifecycles * 1e3, 3) if readable else None}
                        for name, s in per_command.items()},
        "pg_stat_database": {
            "xact_commit": round(db["xact_commit"], 2), "xact_rollback": round(db["xact_rollback"], 2),
            "tup_inserted": round(db["tup_inserted"], 2), "tup_updated": round(db["tup_updated"], 2),
            "wal_bytes": round(db["wal_lsn"]),
        },
    }


# --------------------------------------------------------------------------- 4. history independence


HISTORY_FUNCTIONS = (
    # Deterministic ids per (run tag, kind, index): history rows are reproducible and never collide.
    """CREATE FUNCTION pg_temp.bench_id(tag text, kind text, i bigint) RETURNS uuid
       LANGUAGE sql IMMUTABLE AS $$ SELECT md5(tag || ':' || kind || ':' || i)::uuid $$""",
    # Synthetic chain values: sha256(stream id || version), with the genesis hash (32 zero bytes) at
    # version 0, so prev_hash/hash link up along each stream, but they are NOT the hashes of the
    # events' contents: the chain of the bulk-loaded history does not verify.
    """CREATE FUNCTION pg_temp.bench_hash(id uuid, v bigint) RETURNS bytea
       LANGUAGE sql IMMUTABLE AS $$
       SELECT CASE WHEN v = 0 THEN decode(repeat('00', 32), 'hex') ELSE sha256(uuid_send(id) || int8send(v)) END
       $$""",
    # When the i-th history task was created: bench.t0 + i * bench.step (session settings).
    """CREATE FUNCTION pg_temp.bench_at(i double precision) RETURNS timestamptz
       LANGUAGE sql STABLE AS $$
       SELECT current_setting('bench.t0')::timestamptz + i * current_setting('bench.step')::interval
       $$""",
    """CREATE FUNCTION pg_temp.bench_body(i bigint) RETURNS bytea
       LANGUAGE sql IMMUTABLE AS $$
       SELECT convert_to('[{"kind":"host","type":"asset","value":"host-' || i || '.example.test"}]', 'UTF8')
       $$""",
)

# Parameters of every chunk: tag, org, worker, jobs (per scan), lo..hi (task indices, whole scans).
HISTORY_CHUNK = (
    """
INSERT INTO scans (id, organization_id, status, execution_mode, targets, cancel_requested_at, created_at,
                   updated_at, finished_at, version, head_hash)
SELECT pg_temp.bench_id(%(tag)s, 's', s), %(org)s, 'success', 'gateway',
       jsonb_build_object('hosts', jsonb_build_array('host-' || s || '.example.test')), NULL,
       pg_temp.bench_at(s * %(jobs)s::int) - interval '1 second',
       pg_temp.bench_at(s * %(jobs)s::int + %(jobs)s::int - 1) + interval '3 seconds',
       pg_temp.bench_at(s * %(jobs)s::int + %(jobs)s::int - 1) + interval '3 seconds',
       %(jobs)s::int + 2, pg_temp.bench_hash(pg_temp.bench_id(%(tag)s, 's', s), %(jobs)s::int + 2)
FROM generate_series(%(lo)s::bigint / %(jobs)s::int, %(hi)s::bigint / %(jobs)s::int) AS s
""",
    """
INSERT INTO scan_jobs (id, scan_id, organization_id, position, plugin, status, execution_mode, created_at,
                       updated_at, started_at, finished_at)
SELECT pg_temp.bench_id(%(tag)s, 'j', i), pg_temp.bench_id(%(tag)s, 's', i / %(jobs)s::int), %(org)s,
       i %% %(jobs)s::int, 'probe', 'success', 'gateway', pg_temp.bench_at(i),
       pg_temp.bench_at(i) + interval '3 seconds', pg_temp.bench_at(i) + interval '1 second',
       pg_temp.bench_at(i) + interval '3 seconds'
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i
""",
    """
INSERT INTO worker_tasks (id, scan_job_id, scan_id, organization_id, task_type, required_capabilities,
                          priority, scope, parameters, state, available_at, attempt_count, max_attempts,
                          lease_seconds, execution_timeout_seconds, current_attempt_id, cancel_requested_at,
                          last_error, created_at, updated_at, finished_at, version, head_hash)
SELECT pg_temp.bench_id(%(tag)s, 't', i), pg_temp.bench_id(%(tag)s, 'j', i),
       pg_temp.bench_id(%(tag)s, 's', i / %(jobs)s::int), %(org)s, 'probe', '{}',
       0, jsonb_build_object('host', 'host-' || i || '.example.test'), '{}', 'completed',
       pg_temp.bench_at(i), 1, 3, 60, 600, pg_temp.bench_id(%(tag)s, 'a', i), NULL, NULL,
       pg_temp.bench_at(i), pg_temp.bench_at(i) + interval '3 seconds',
       pg_temp.bench_at(i) + interval '3 seconds', 5, pg_temp.bench_hash(pg_temp.bench_id(%(tag)s, 't', i), 5)
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i
""",
    """
INSERT INTO worker_task_attempts (id, task_id, worker_id, attempt_number, lease_token_hash, status, leased_at,
                                  lease_expires_at, deadline_at, started_at, finished_at, batch_count,
                                  final_batch_accepted, error)
SELECT pg_temp.bench_id(%(tag)s, 'a', i), pg_temp.bench_id(%(tag)s, 't', i), %(worker)s, 1,
       sha256(convert_to(%(tag)s || ':lease:' || i, 'UTF8')), 'succeeded',
       pg_temp.bench_at(i) + interval '1 second', pg_temp.bench_at(i) + interval '61 seconds',
       pg_temp.bench_at(i) + interval '601 seconds', pg_temp.bench_at(i) + interval '2 seconds',
       pg_temp.bench_at(i) + interval '3 seconds', 1, true, NULL
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i
""",
    """
INSERT INTO result_payloads (sha256, body, created_at)
SELECT encode(sha256(pg_temp.bench_body(i)), 'hex'), pg_temp.bench_body(i),
       pg_temp.bench_at(i) + interval '2 seconds'
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i
""",
    """
INSERT INTO worker_result_batches (id, task_id, attempt_id, sequence_number, idempotency_key, payload_sha256,
                                   record_count, final, status, accepted_at)
SELECT pg_temp.bench_id(%(tag)s, 'b', i), pg_temp.bench_id(%(tag)s, 't', i),
       pg_temp.bench_id(%(tag)s, 'a', i), 1, 'final', encode(sha256(pg_temp.bench_body(i)), 'hex'), 1, true,
       'persisted', pg_temp.bench_at(i) + interval '2 seconds'
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i
""",
    # Every event of these tasks and their scans, task by task (so notification_id roughly follows
    # time): the scan's ScanCreated (first job only) and ScanJobQueued, then TaskCreated,
    # TaskLeased, TaskStarted, ResultBatchAccepted, TaskCompleted, then the scan's ScanFinished
    # (last job only). The states are jsonb renderings of the fields the real events carry.
    """
WITH t AS MATERIALIZED (
    SELECT i, i %% %(jobs)s::int AS pos, pg_temp.bench_id(%(tag)s, 't', i) AS task,
           pg_temp.bench_id(%(tag)s, 'j', i) AS job, pg_temp.bench_id(%(tag)s, 's', i / %(jobs)s::int) AS scan,
           pg_temp.bench_id(%(tag)s, 'a', i) AS att, pg_temp.bench_id(%(tag)s, 'b', i) AS batch,
           pg_temp.bench_at(i) AS c, 'worker:' || %(worker)s::text AS actor,
           jsonb_build_object('host', 'host-' || i || '.example.test') AS scope
    FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i
)
INSERT INTO events (originator_id, originator_version, topic, state, recorded_at, prev_hash, hash)
SELECT e.id, e.v, e.topic, convert_to(e.state::text, 'UTF8'), e.at, pg_temp.bench_hash(e.id, e.v - 1),
       pg_temp.bench_hash(e.id, e.v)
FROM t CROSS JOIN LATERAL (VALUES
    (0, t.scan, 1, 'domain.events:ScanCreated', t.c - interval '1 second', jsonb_build_object(
        'timestamp', t.c - interval '1 second', 'actor', 'system', 'organization_id', %(org)s::uuid,
        'targets', jsonb_build_object('hosts', jsonb_build_array('host-' || t.i / %(jobs)s::int || '.example.test')),
        'execution_mode', 'gateway')),
    (1, t.scan, t.pos + 2, 'domain.events:ScanJobQueued', t.c, jsonb_build_object(
        'timestamp', t.c, 'actor', 'system', 'job_id', t.job, 'organization_id', %(org)s::uuid,
        'position', t.pos, 'plugin', 'probe', 'execution_mode', 'gateway')),
    (2, t.task, 1, 'domain.events:TaskCreated', t.c, jsonb_build_object(
        'timestamp', t.c, 'actor', 'system', 'scan_id', t.scan, 'scan_job_id', t.job,
        'organization_id', %(org)s::uuid, 'task_type', 'probe', 'required_capabilities', '[]'::jsonb,
        'priority', 0, 'scope', t.scope, 'parameters', '{}'::jsonb, 'max_attempts', 3, 'lease_seconds', 60,
        'execution_timeout_seconds', 600, 'available_at', t.c)),
    (3, t.task, 2, 'domain.events:TaskLeased', t.c + interval '1 second', jsonb_build_object(
        'timestamp', t.c + interval '1 second', 'actor', t.actor, 'scan_id', t.scan, 'scan_job_id', t.job,
        'attempt_id', t.att, 'worker_id', %(worker)s::uuid, 'attempt_number', 1,
        'lease_token_hash', encode(sha256(convert_to(%(tag)s || ':lease:' || t.i, 'UTF8')), 'hex'),
        'lease_expires_at', t.c + interval '61 seconds', 'deadline_at', t.c + interval '601 seconds')),
    (4, t.task, 3, 'domain.events:TaskStarted', t.c + interval '2 seconds', jsonb_build_object(
        'timestamp', t.c + interval '2 seconds', 'actor', t.actor, 'attempt_id', t.att)),
    (5, t.task, 4, 'domain.events:ResultBatchAccepted', t.c + interval '2 seconds', jsonb_build_object(
        'timestamp', t.c + interval '2 seconds', 'actor', t.actor, 'attempt_id', t.att, 'batch_id', t.batch,
        'sequence_number', 1, 'idempotency_key', 'final',
        'payload_sha256', encode(sha256(pg_temp.bench_body(t.i)), 'hex'), 'record_count', 1, 'final', true)),
    (6, t.task, 5, 'domain.events:TaskCompleted', t.c + interval '3 seconds', jsonb_build_object(
        'timestamp', t.c + interval '3 seconds', 'actor', t.actor, 'scan_job_id', t.job, 'attempt_id', t.att)),
    (7, t.scan, %(jobs)s::int + 2, 'domain.events:ScanFinished', t.c + interval '3 seconds', jsonb_build_object(
        'timestamp', t.c + interval '3 seconds', 'actor', 'system', 'status', 'success'))
) AS e(k, id, v, topic, at, state)
WHERE (e.k <> 0 OR t.pos = 0) AND (e.k <> 7 OR t.pos = %(jobs)s::int - 1)
""",
)


def _load_chunks(url: str, params: dict[str, Any], t0: datetime, step: timedelta,
                 chunks: deque[tuple[int, int]], progress: Callable[[int], None]) -> None:
    """One loader connection: take chunks until none are left, one transaction each."""
    with psycopg.connect(url) as conn:
        conn.execute("SET synchronous_commit = off")  # bulk load only; the measured commands are durable
        for ddl in HISTORY_FUNCTIONS:
            conn.execute(ddl)
        conn.execute("SELECT set_config('bench.t0', %s::timestamptz::text, false),"
                     " set_config('bench.step', %s::interval::text, false)", (t0, step))
        conn.commit()
        while True:
            try:
                lo, hi = chunks.popleft()
            except IndexError:
                return
            for statement in HISTORY_CHUNK:
                conn.execute(statement, {**params, "lo": lo, "hi": hi})
            conn.commit()
            progress(hi - lo + 1)


def bulk_load_history(url: str, org: UUID, worker: UUID, tasks: int, chunk: int, parallel: int,
                      ) -> dict[str, Any]:
    """``tasks`` completed tasks of ``org`` (leased by ``worker``) over the last 30 days, with
    their scans (``HISTORY_JOBS_PER_SCAN`` jobs each), attempts, batches, payloads and events;
    ``parallel`` loader connections; then ``VACUUM ANALYZE``."""
    jobs = HISTORY_JOBS_PER_SCAN
    tasks = math.ceil(tasks / jobs) * jobs  # whole scans only
    chunk = max(jobs, chunk // jobs * jobs)
    params: dict[str, Any] = {"tag": secrets.token_hex(4), "org": org, "worker": worker, "jobs": jobs}
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT now() - interval '30 days'").fetchone()  # the history ends an hour ago
        assert row is not None
    t0, step = row[0], timedelta(seconds=(30 * 86400 - 3600) / tasks)
    chunks = deque((lo, min(lo + chunk, tasks) - 1) for lo in range(0, tasks, chunk))
    started = time.perf_counter()
    done = [0]
    lock = threading.Lock()

    def progress(n: int) -> None:
        with lock:
            done[0] += n
            log(f"history: {done[0]:,}/{tasks:,} tasks loaded "
                f"({done[0] / (time.perf_counter() - started):,.0f} tasks/s)")

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for future in [pool.submit(_load_chunks, url, params, t0, step, chunks, progress)
                       for _ in range(parallel)]:
            future.result()
    load_s = time.perf_counter() - started
    log("history: VACUUM ANALYZE")
    vacuum_s = vacuum_analyze(url)
    # Sanity: a loaded task's stream decodes with the real mapper and folds to "completed".
    sample_state = _fold_state(url, UUID(hashlib.md5(f"{params['tag']}:t:0".encode()).hexdigest()))
    counts: dict[str, int] = {}
    with psycopg.connect(url) as conn:
        for table in ("worker_tasks", "worker_task_attempts", "worker_result_batches", "result_payloads",
                      "scan_jobs", "scans", "events"):
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
            assert row is not None
            counts[table] = int(row[0])
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        assert size is not None
    return {"tasks": tasks, "load_s": round(load_s, 1), "vacuum_analyze_s": round(vacuum_s, 1),
            "parallel": parallel, "rows": counts, "database_mb": round(int(size[0]) / 2**20),
            "sample_task_state": sample_state}


def _fold_state(url: str, task_id: UUID) -> str | None:
    async def fold() -> str | None:
        conn = await connect(url)
        try:
            task = project_task(await read_stream(conn, task_id))
        finally:
            await conn.close()
        return task.state if task is not None else None

    return asyncio.run(fold())


async def gather_limited(jobs: list[Callable[[], Awaitable[Any]]], limit: int) -> None:
    queue = deque(jobs)

    async def run() -> None:
        while queue:
            await queue.popleft()()

    await asyncio.gather(*(run() for _ in range(limit)))


def analyze(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")


def acquire_plan(url: str, worker: UUID) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the acquire query for ``worker`` (rolled back): how it reads
    worker_tasks and how many buffers it touched, a figure the load of the machine cannot skew."""
    from leasehold.persistence.queries import QUERIES  # the service's own statement

    try:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT w.capabilities, w.task_types, now() FROM workers w WHERE w.id = %s",
                               (worker,)).fetchone()
            assert row is not None
            # As the service runs it: worker_live_attempts first, in the same transaction (it
            # also sets the planner settings the acquire statements run with), then the
            # organisations' candidates, then the lock in the first organisation.
            params = {"worker_id": worker, "now": row[2], "task_types": sorted(row[1]),
                      "capabilities": sorted(row[0])}
            conn.execute(QUERIES["worker_live_attempts"], params)
            candidate = conn.execute(QUERIES["fair_share_candidates"], params).fetchone()
            assert candidate is not None, "no candidate organisation"
            plan = conn.execute(
                sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + sql.SQL(QUERIES["task_lock_for_organization"]),
                {**params, "organization_id": candidate[0], "floor": 0.0, "quantum": 1.0, "ceiling": 1e300}).fetchone()
            conn.rollback()
    except (psycopg.Error, KeyError, AssertionError) as exc:
        return {"error": str(exc)}
    assert plan is not None
    top = plan[0][0]

    def scans(node: dict[str, Any]) -> Iterator[str]:
        if node.get("Relation Name") == "worker_tasks":
            yield f"{node['Node Type']}" + (f" using {node['Index Name']}" if "Index Name" in node else "")
        for child in node.get("Plans", []):
            yield from scans(child)

    root = top["Plan"]
    return {"worker_tasks_access": "; ".join(scans(root)) or "?",
            "buffers": int(root.get("Shared Hit Blocks", 0)) + int(root.get("Shared Read Blocks", 0)),
            "execution_ms": round(float(top["Execution Time"]), 3)}


async def acquire_latencies(scans: Scans, lifecycle: Lifecycle, loop: BenchLoop, n: int, url: str,
                            analyze_first: bool) -> dict[str, Any]:
    """Queue ``n`` (+ warm-up) pending tasks, ``ANALYZE`` if ``analyze_first``, then acquire them
    one by one, timing only ``acquire``; each acquired task is completed (untimed) before the next
    acquire, so the worker holds at most one live attempt. Also the CPU its backend spent in the
    acquires (the pool has one connection), the plan, and who else used the CPU meanwhile."""
    total = n + ACQUIRE_WARMUP
    scans = [await new_scan(scans, loop) for _ in range(math.ceil(total / HISTORY_JOBS_PER_SCAN))]

    def creator(scan: UUID, count: int) -> Callable[[], Awaitable[None]]:
        async def create() -> None:
            for _ in range(count):
                await lifecycle.create_task(scan, SPEC)
        return create

    remaining, jobs = total, []
    for scan in scans:
        count = min(HISTORY_JOBS_PER_SCAN, remaining)
        jobs.append(creator(scan, count))
        remaining -= count
    await gather_limited(jobs, 4)
    if analyze_first:
        await asyncio.to_thread(analyze, url)
    plan = await asyncio.to_thread(acquire_plan, url, loop.worker)
    backend = await asyncio.to_thread(bench_backend_pid, url)
    latencies: list[float] = []
    backend_s = 0.0
    window = CpuWindow(os.getpid())
    wal0 = 0
    for i in range(total):
        if i == ACQUIRE_WARMUP:
            window.start()
            wal0 = await asyncio.to_thread(wal_lsn, url)
        cpu0, t0 = backend_cpu(backend), time.perf_counter()
        acquired = await lifecycle.acquire(loop.worker)
        elapsed, cpu1 = time.perf_counter() - t0, backend_cpu(backend)
        if acquired is None:
            raise RuntimeError("acquire found nothing although tasks are pending")
        if i >= ACQUIRE_WARMUP:
            latencies.append(elapsed)
            backend_s += cpu1 - cpu0
        records = [{"type": "asset", "kind": "host", "value": f"{acquired.task.id}.bench.example.test"}]
        await lifecycle.submit_batch(
            loop.worker, acquired.task.id, acquired.attempt.id, acquired.lease_token, sequence_number=1,
            idempotency_key="final", payload_sha256=payload_sha256(records), records=records, final=True)
        await lifecycle.complete(loop.worker, acquired.task.id, acquired.attempt.id, acquired.lease_token)
    wal = await asyncio.to_thread(wal_lsn, url) - wal0
    return {**latency_summary(latencies), "plan": plan, "cpu_cores": window.stop(),
            "wal_bytes_per_iteration": round(wal / n),
            "backend_cpu_ms": round(backend_s / n * 1e3, 3) if backend is not None else None}


def latency_summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(values, 50) * 1e3, 3), "p99_ms": round(percentile(values, 99) * 1e3, 3),
            "mean_ms": round(statistics.fmean(values) * 1e3, 3), "n": len(values)}


async def measure_history(url: str, history: int, acquires: int, chunk: int, parallel: int,
                          ) -> dict[str, Any]:
    """Acquire latency before and after the bulk load, each time twice: first with the backlog
    queued after the last ``VACUUM ANALYZE`` (the planner has not seen the pending tasks: "stale"),
    then with a fresh backlog and ``ANALYZE`` after queueing it ("analyzed")."""
    pool: AsyncConnectionPool = create_pool(url, min_size=1, max_size=1)
    await pool.open(wait=True)
    samples: dict[str, dict[str, Any]] = {}
    try:
        services = build_services(Database(pool))
        registry, lifecycle, scans = services.registry, services.lifecycle, services.scans
        loop = await make_loop(registry, f"bench-history-{secrets.token_hex(4)}")
        await asyncio.to_thread(vacuum_analyze, url)
        load: dict[str, Any] = {"tasks": 0}
        for state in ("empty", "loaded"):
            if state == "loaded":
                log(f"history: bulk-loading {history:,} completed tasks")
                load = await asyncio.to_thread(bulk_load_history, url, loop.org, loop.worker, history, chunk,
                                               parallel)
            for stats in ("stale", "analyzed"):
                log(f"history: {acquires} acquires, {state} database, {stats} statistics")
                samples[f"{state}_{stats}"] = await acquire_latencies(
                    scans, lifecycle, loop, acquires, url, stats == "analyzed")
    finally:
        await pool.close()
    result: dict[str, Any] = {"history_tasks": load["tasks"], "load": load}
    for stats in ("analyzed", "stale"):
        e, h = samples[f"empty_{stats}"], samples[f"loaded_{stats}"]
        result[stats] = {"empty": e, "loaded": h, "ratio_p50": round(h["p50_ms"] / e["p50_ms"], 3),
                         "ratio_p99": round(h["p99_ms"] / e["p99_ms"], 3),
                         "ratio_mean": round(h["mean_ms"] / e["mean_ms"], 3)}
        if e["backend_cpu_ms"] and h["backend_cpu_ms"] is not None:
            result[stats]["ratio_backend_cpu"] = round(h["backend_cpu_ms"] / e["backend_cpu_ms"], 3)
    return result


# --------------------------------------------------------------------------- main


def code_fingerprint() -> str:
    """The commit, and a hash of the service code as it is on disk (the tree may be dirty)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for package in ("domain", "projections", "gateway", "migrations"):
        for path in sorted((root / package).rglob("*")):
            if path.suffix in (".py", ".sql") and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head, dirty = "unknown", ""
    return f"commit={head}{'+dirty' if dirty else ''} service_code_sha256={digest.hexdigest()[:12]}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--database-url", help="maintenance-database URL of the server (default: "
                   "$BENCH_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/postgres if it "
                   "answers, else the embedded server)")
    p.add_argument("--yardstick-dir", type=Path, default=DEFAULT_YARDSTICK_DIR,
                   help=f"directory holding pg_limit.sh (default {DEFAULT_YARDSTICK_DIR})")
    p.add_argument("--seconds", type=float, default=15, help="timed window per run (default 15)")
    p.add_argument("--warmup", type=float, default=3, help="warm-up per throughput run (default 3)")
    p.add_argument("--concurrency", type=int, default=8, help="asyncio loops per process (default 8)")
    p.add_argument("--step-by-step", action="store_true",
                   help="submit the final batch on its own, then complete (4 commands a lifecycle instead of 3)")
    p.add_argument("--no-prepared-statements", action="store_true",
                   help="psycopg prepares no statement on the server (as the Gateway behind a transaction pooler)")
    p.add_argument("--processes", type=int, default=2, help="processes of the multi-process run (default 2)")
    p.add_argument("--limit-clients", type=int, help="pg_limit clients (default: --concurrency)")
    p.add_argument("--cost-lifecycles", type=int, default=200, help="lifecycles counted on the wire (default 200)")
    p.add_argument("--history", type=int, default=1_000_000, help="completed tasks to bulk-load (default 1e6)")
    p.add_argument("--history-chunk", type=int, default=50_000, help="tasks per bulk-load transaction")
    p.add_argument("--history-parallel", type=int, default=2, help="bulk-load connections (default 2)")
    p.add_argument("--acquires", type=int, default=2000, help="timed acquires per history state (default 2000)")
    p.add_argument("--paced-share", type=float, default=0.1,
                   help="the paced section offers this share of the best measured rate (default 0.1)")
    p.add_argument("--skip", action="append", default=[],
                   choices=["limit", "replica", "single", "multi", "paced", "profile", "cost", "history"],
                   help="skip a section (repeatable)")
    p.add_argument("--scratch-prefix", default=BENCH_DB,
                   help="names of the scratch databases it drops and recreates (default leasehold_bench)")
    p.add_argument("--profile", type=Path, metavar="FILE",
                   help="only run a single-process throughput run in-process under cProfile, save the "
                        "stats to FILE and print the top 15 functions (cumulative and self time)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (the lines go to stderr)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    global BENCH_DB, LIMIT_DB, REPLICA_DB
    args = parse_args(argv)
    BENCH_DB, LIMIT_DB, REPLICA_DB = (args.scratch_prefix, f"{args.scratch_prefix}_limit",
                                      f"{args.scratch_prefix}_replica")
    os.environ[STEP_BY_STEP_ENV] = "1" if args.step_by_step else "0"  # spawned processes inherit these
    os.environ[NO_PREPARE_ENV] = "1" if args.no_prepared_statements else "0"
    server_url, origin = resolve_server_url(args.database_url)
    log(f"server: {redact_url(server_url)} ({origin})")
    conc, seconds = args.concurrency, args.seconds
    out: dict[str, Any] = {"server": redact_url(server_url), "server_origin": origin, "cpus": os.cpu_count()}
    with psycopg.connect(server_url) as conn:
        row = conn.execute("SELECT current_setting('server_version'), current_setting('autovacuum'),"
                           " current_setting('synchronous_commit'), current_setting('shared_buffers')").fetchone()
        assert row is not None
        out["server_version"], out["autovacuum"], out["synchronous_commit"], out["shared_buffers"] = row
    lines: list[str] = []
    out["code"] = code_fingerprint()
    load = os.getloadavg()
    out["loadavg_at_start"] = [round(v, 2) for v in load]
    lines.append(f"machine cpus={os.cpu_count()} loadavg_at_start={load[0]:.2f},{load[1]:.2f},{load[2]:.2f} "
                 f"server_version={out['server_version']} autovacuum={out['autovacuum']} "
                 f"synchronous_commit={out['synchronous_commit']} shared_buffers={out['shared_buffers']}")
    lines.append(f"code {out['code']}")

    if args.profile:
        url = fresh_bench_database(server_url)
        log(f"profile: procs=1 conc={conc} seconds={seconds}")
        tables = profile_throughput(url, conc, seconds, args.warmup, args.profile)
        print(f"cProfile of the timed window ({args.profile}), top 15 by cumulative time:\n"
              f"{tables['cumulative']}\ntop 15 by self time:\n{tables['tottime']}")
        return 0

    if "limit" not in args.skip:
        clients = args.limit_clients or conc
        limit_url = recreate_database(server_url, LIMIT_DB)
        log(f"pg_limit: clients={clients} seconds={int(seconds)}")
        window = CpuWindow(os.getpid())
        window.start()
        limit = run_pg_limit(args.yardstick_dir, limit_url, clients, int(seconds))
        box = window.stop()  # the window includes the script's schema set-up and prefill
        out["pg_limit"] = {"clients": clients, "seconds": int(seconds), "lifecycles_per_s": limit,
                           "cpu_cores_during_script": box}
        lines.append(f"pg_limit clients={clients} seconds={int(seconds)} lifecycles_per_s={limit}")
        lines.append("pg_limit_cpu " + " ".join(f"{k}={v}" for k, v in box.items())
                     + " (whole script, prefill included; pgbench and its backends exit before the"
                     " reading, so they count as other)")

    if "replica" not in args.skip:
        clients = args.limit_clients or conc
        log(f"replica: clients={clients} seconds={int(seconds)}")
        replica = run_replica(server_url, clients, max(1, int(seconds)))
        out["replica"] = {"clients": clients, "lifecycles_per_s": replica}
        ratio = (f" ratio_to_pg_limit={replica / out['pg_limit']['lifecycles_per_s']:.3f}"
                 if "pg_limit" in out else "")
        lines.append(f"replica_lifecycle clients={clients} seconds={max(1, int(seconds))} "
                     f"lifecycles_per_s={replica}{ratio} (our statements and rows in pure SQL, pgbench: "
                     "the best the service layer could do with a client that cost nothing)")

    url = fresh_bench_database(server_url)
    runs: list[dict[str, Any]] = []
    for section, procs in (("single", 1), ("multi", args.processes)):
        if section in args.skip:
            continue
        log(f"throughput: procs={procs} conc={conc} seconds={seconds}")
        r = run_throughput(url, procs, conc, seconds, args.warmup)
        runs.append(r)
        steps = " ".join(f"{name}_p50={v['p50']} {name}_p99={v['p99']}" for name, v in r["step_ms"].items())
        lines.append(f"core_lifecycle procs={procs} conc={conc} total_loops={procs * conc} seconds={seconds:g} "
                     f"lifecycles={r['lifecycles']} lifecycles_per_s={r['lifecycles_per_s']}")
        lines.append(f"core_lifecycle_step_ms procs={procs} {steps} lifecycle_mean={r['lifecycle_ms_mean']} "
                     f"client_cpu_ms_per_lifecycle={r['client_cpu_s_per_lifecycle_ms']} "
                     f"scan_refills={r['scan_refills_in_timed_window']} acquire_misses={r['acquire_misses']}")
        lines.append(f"core_lifecycle_cpu procs={procs} "
                     + " ".join(f"{k}={v}" for k, v in r["cpu_cores_during_window"].items())
                     + " (cores used during the timed window; postgres includes other clients' backends)")
    out["core_lifecycle"] = runs
    if runs and "pg_limit" in out:
        best = max(runs, key=lambda r: r["lifecycles_per_s"])
        ratio = round(best["lifecycles_per_s"] / out["pg_limit"]["lifecycles_per_s"], 3)
        out["ratio_to_pg_limit"] = {"ratio": ratio, "best_procs": best["procs"]}
        lines.append(f"ratio_to_pg_limit={ratio} (best: procs={best['procs']} conc={conc}, "
                     f"pg_limit clients={out['pg_limit']['clients']})")
    if runs and "replica" in out:
        best = max(runs, key=lambda r: r["lifecycles_per_s"])
        lines.append(f"ratio_to_replica={best['lifecycles_per_s'] / out['replica']['lifecycles_per_s']:.3f} "
                     "(the service layer against the same statements and rows in pure SQL)")

    if "paced" not in args.skip and runs:
        best = max(r["lifecycles_per_s"] for r in runs)
        rate = best * args.paced_share
        log(f"paced: {rate:.1f} lifecycles/s ({args.paced_share:g} of the best) over {conc} loops")
        paced = asyncio.run(paced_latencies(url, conc, rate, seconds))
        out["paced"] = paced
        steps = " ".join(f"{name}_p50={v['p50']} {name}_p99={v['p99']}" for name, v in paced["step_ms"].items())
        lines.append(f"core_paced share={args.paced_share:g} offered_per_s={paced['offered_per_s']} "
                     f"lifecycles={paced['lifecycles']} {steps} "
                     "(latency at a fraction of the peak: what an idle-ish system answers)")

    if "profile" not in args.skip:
        log(f"profile scans: procs=1 conc={conc} seconds={seconds} steps={len(PROFILE)} targets={PROFILE_TARGETS}")
        p = asyncio.run(profile_scans(fresh_bench_database(server_url), conc, seconds, args.warmup))
        out["profile_scans"] = p
        ratio = (f" ratio_to_pg_limit={p['tasks_per_s'] / out['pg_limit']['lifecycles_per_s']:.3f}"
                 if "pg_limit" in out else "")
        lines.append(f"core_profile_scans procs=1 conc={conc} steps={len(PROFILE)} targets={PROFILE_TARGETS} "
                     f"tasks={p['tasks']} tasks_per_s={p['tasks_per_s']} "
                     f"client_cpu_ms_per_task={p['client_cpu_ms_per_task']}{ratio} (acquire, then complete "
                     "carrying the batch; the next step's task created as each step ends)")

    if "cost" not in args.skip:
        log(f"cost: {args.cost_lifecycles} sequential lifecycles through the counting relay")
        cost = asyncio.run(measure_cost(server_url, url, args.cost_lifecycles))
        out["cost"] = cost
        w, db = cost["wire"], cost["pg_stat_database"]
        lines.append(f"cost_per_lifecycle round_trips={w['round_trips']} statements={w['statements']} "
                     f"syncs={w['syncs']} commits={w['commits']} noop_updates={w['noop_updates']} "
                     f"bytes_up={w['bytes_up']} bytes_down={w['bytes_down']} "
                     f"(wire, n={cost['lifecycles']})")
        lines.append(f"cost_per_lifecycle backend_cpu_ms={cost['backend_cpu_ms']} (CPU of the one PostgreSQL "
                     f"backend serving these lifecycles, from /proc; n={cost['lifecycles']})")
        lines.append(f"cost_per_lifecycle xact_commit={db['xact_commit']} tup_inserted={db['tup_inserted']} "
                     f"tup_updated={db['tup_updated']} wal_bytes={db['wal_bytes']} "
                     f"(pg_stat_database of {BENCH_DB}; WAL is server-wide)")
        lines.append("cost_statement_tags " + " ".join(f"{k}={v}" for k, v in w["by_tag"].items()))
        limit_cpu = None
        if (args.yardstick_dir / "pg_limit_schema.sql").exists():
            limit_cpu = pg_limit_backend_cpu(args.yardstick_dir, recreate_database(server_url, LIMIT_DB),
                                             args.cost_lifecycles * 10)
        else:
            log(f"no yardstick in {args.yardstick_dir}: the ceiling line is left out")
        out["cost"]["pg_limit_backend_cpu_ms"] = limit_cpu
        if limit_cpu and cost["backend_cpu_ms"]:
            # PostgreSQL's own work bounds the ratio even if the client side cost nothing.
            lines.append(f"ceiling backend_cpu_ms leasehold={cost['backend_cpu_ms']} pg_limit={limit_cpu} "
                         f"backend_cpu_ratio={cost['backend_cpu_ms'] / limit_cpu:.1f} "
                         f"ratio_ceiling_if_client_free={limit_cpu / cost['backend_cpu_ms']:.2f} "
                         f"(the yardstick's lifecycle, sequential on one connection, same /proc reading)")
        for name, c in cost["per_command"].items():
            lines.append(f"cost_per_command {name} round_trips={c['round_trips']} statements={c['statements']} "
                         f"syncs={c['syncs']} commits={c['commits']} backend_cpu_ms={c['backend_cpu_ms']} "
                         + " ".join(f"{k}={v}" for k, v in c["by_tag"].items()))

    if "history" not in args.skip:
        url = fresh_bench_database(server_url)
        hist = asyncio.run(measure_history(url, args.history, args.acquires, args.history_chunk,
                                           args.history_parallel))
        out["history"] = hist
        n = hist["history_tasks"]
        for stats, note in (("analyzed", "ANALYZE after queueing the backlog"),
                            ("stale", "backlog queued after the last ANALYZE")):
            h = hist[stats]
            suffix = "" if stats == "analyzed" else "_stale_stats"
            for q in ("p50", "p99"):
                lines.append(f"acquire_{q}_ms{suffix} empty={h['empty'][q + '_ms']} "
                             f"history_{n}={h['loaded'][q + '_ms']} ratio={h['ratio_' + q]} ({note})")
            lines.append(f"acquire_backend_cpu_ms{suffix} empty={h['empty']['backend_cpu_ms']} "
                         f"history_{n}={h['loaded']['backend_cpu_ms']} ratio={h.get('ratio_backend_cpu')} "
                         "(mean CPU of the serving backend per acquire, /proc ticks)")
            for state in ("empty", "loaded"):
                plan, cpu = h[state]["plan"], h[state]["cpu_cores"]
                lines.append(f"acquire_plan{suffix} {state}: worker_tasks via {plan.get('worker_tasks_access')}, "
                             f"buffers={plan.get('buffers')} execution_ms={plan.get('execution_ms')}; "
                             f"wal_bytes_per_acquire_submit_complete={h[state]['wal_bytes_per_iteration']}; "
                             "cpu " + " ".join(f"{k}={v}" for k, v in cpu.items()))
        load = hist["load"]
        lines.append(f"history_load tasks={n} load_s={load['load_s']} vacuum_analyze_s={load['vacuum_analyze_s']} "
                     f"database_mb={load['database_mb']} sample_task_folds_to={load['sample_task_state']} "
                     + " ".join(f"{k}={v}" for k, v in load["rows"].items())
                     + " (synthetic: hash-chain values are sha256(stream id, version), not verifiable)")

    if args.json:
        print("\n".join(lines), file=sys.stderr)
        print(json.dumps(out, indent=2, default=str))
    else:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
