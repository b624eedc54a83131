"""Fair shares benchmark: a flooding organisation against two small ones on shared workers.

Prints numbers, asserts nothing. Sections (each can be skipped with ``--skip``):

1. ``idle``: ``--workers`` workers (capacity 1 each) shared by organisations A, B and C; B and C
   queue ``--others`` tasks each, nothing else is queued. Each task "runs" ``--task-ms`` on the
   worker (a sleep), then completes with its final batch. The waits of B's and C's tasks (from
   the moment each was queued to its lease): the yardstick.
2. ``fair``: the same workers, A first queues ``--flood`` tasks, the workers start, and after
   ``--head-start`` leases B and C queue theirs. B's and C's waits, and each organisation's share
   of the leases in windows of ``--window`` leases, until B's and C's last tasks are leased.
3. ``unfair``: the same with fair shares off (``build_services(fair_shares=False)``, the
   Gateway's ``--no-fair-shares``): the oldest task first, so B and C wait for A's whole flood.
4. ``cost``: acquire latency of one worker assigned to 1, 10, 100 and 200 organisations
   (``--cost-orgs``), each with queued tasks: ``--cost-acquires`` timed acquires, sequential,
   each lease completed (untimed) before the next. Every organisation is a candidate here, so
   the cost grows with them (each one's best task is compared).
5. ``served``: one worker per count of ``--cost-orgs``, each serving ``--served-busy``
   (default 1) organisations with queued tasks and idle ones up to its count: what an
   organisation served costs an acquire when it has nothing queued. The workers' acquires are
   timed in turns in one database, so the load of the machine drifts alike for every count. Its
   ``goal_`` lines: p50 at the largest count within 1.2x of the first, the probe's buffers within 2x.

Each section runs on a fresh scratch database ``--database-name`` (default
``leasehold_bench_fair``), a copy of ``<name>_template`` migrated once per run; both are dropped
at the end: never point it at databases of those names that matter. Usage: ``.venv/bin/python bench/fairness.py`` (``--help`` for everything); the acquire
history bar is ``bench/core_lifecycle.py --skip limit --skip replica --skip single --skip multi
--skip profile --skip cost`` (see bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import secrets
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from common import percentile, recreate_database, resolve_server_url
from psycopg import sql

from leasehold.cli.embedded import with_database
from leasehold.domain.results import payload_sha256
from leasehold.gateway.commands.lifecycle import ResultBatch, TaskSpec
from leasehold.gateway.services import Services, build_services
from leasehold.migrations import runner as migrate
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database

TASK_TYPE = "probe"
SPEC = TaskSpec(task_type=TASK_TYPE, scope={"host": "bench.example.test"}, lease_seconds=300,
                execution_timeout_seconds=600)
RECORDS = [{"type": "asset", "kind": "host", "value": "bench.example.test"}]
FINAL = ResultBatch(1, "final", payload_sha256(RECORDS), RECORDS)
TASKS_PER_SCAN = 100  # a scan takes jobs while it is open; the flood is spread over scans of this size


def log(message: str) -> None:
    print(f"[fairness {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Run:
    """What one scenario recorded: each lease (wall time, organisation name) and each small
    organisation's waits."""

    leases: list[tuple[float, str, bool]] = field(default_factory=list)  # (when, organisation, all had work)
    queued_at: dict[UUID, float] = field(default_factory=dict)
    created: dict[str, int] = field(default_factory=lambda: {"B": 0, "C": 0})
    waits: dict[str, list[float]] = field(default_factory=lambda: {"B": [], "C": []})
    others_queued_at: float = 0.0
    seconds: float = 0.0


def migrated_copy(server_url: str, name: str) -> str:
    """A fresh database ``name`` at the latest migration: a copy of ``<name>_template``, which is
    migrated once per run (copying a database is much faster than migrating one)."""
    template = f"{name}_template"
    with psycopg.connect(server_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (template,)).fetchone()
    if exists is None or template not in MIGRATED:
        migrate.upgrade(recreate_database(server_url, template))
        MIGRATED.add(template)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template)))
    return with_database(server_url, name)


MIGRATED: set[str] = set()


def drop_databases(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        for database in (name, f"{name}_template"):
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))


async def fresh_services(server_url: str, name: str, connections: int, *, fair: bool
                         ) -> tuple[Services, Any]:
    url = await asyncio.to_thread(migrated_copy, server_url, name)
    pool = create_pool(url, min_size=connections, max_size=connections)
    await pool.open(wait=True)
    return build_services(Database(pool), fair_shares=fair), pool


async def queue_tasks(services: Services, org: UUID, n: int, run: Run | None = None, lanes: int = 4,
                      name: str = "") -> None:
    """``n`` tasks of ``org`` in scans of :data:`TASKS_PER_SCAN`, ``lanes`` at once; with ``run``,
    each task's queueing time (once committed) is kept, and how many of ``name``'s are queued."""
    scans = [await services.scans.create_scan(org, {"hosts": ["bench.example.test"]})
             for _ in range(max(1, math.ceil(n / TASKS_PER_SCAN)))]

    async def fill(lane: int) -> None:
        for i in range(lane, n, lanes):
            task = await services.lifecycle.create_task(scans[i // TASKS_PER_SCAN], SPEC)
            if run is not None:
                run.queued_at[task.id] = time.perf_counter()
                run.created[name] += 1

    await asyncio.gather(*(fill(lane) for lane in range(min(lanes, n))))


async def scenario(server_url: str, args: argparse.Namespace, *, flood: int, fair: bool) -> Run:
    services, pool = await fresh_services(server_url, args.database_name, args.workers + 2 * args.queue_lanes + 2,
                                          fair=fair)
    run = Run()
    try:
        registry, lifecycle = services.registry, services.lifecycle
        orgs = {name: await registry.create_organization(f"bench-{name}") for name in ("A", "B", "C")}
        names = {org: name for name, org in orgs.items()}
        for name, weight in args.weight_of.items():
            if weight != 1:
                await registry.set_fair_share(orgs[name], weight=weight, max_live_attempts=None)
        workers = []
        for i in range(args.workers):
            worker = await registry.register_worker(name=f"bench-shared-{i}", fingerprint=secrets.token_hex(32),
                                                    task_types=(TASK_TYPE,), max_concurrent_tasks=1)
            for org in orgs.values():
                await registry.assign_worker(worker, org)
            workers.append(worker)
        if flood:
            log(f"A queues {flood:,} tasks")
            await queue_tasks(services, orgs["A"], flood, lanes=8)
        small = {"B": args.others, "C": args.others}
        left = dict(small)
        leased = {"B": 0, "C": 0}
        done = asyncio.Event()
        started = asyncio.Event()
        task_seconds = args.task_ms / 1000

        async def work(worker: UUID) -> None:
            while not done.is_set():
                a = await lifecycle.acquire(worker)
                if a is None:
                    await asyncio.sleep(0.002)
                    continue
                now = time.perf_counter()
                name = names[a.task.organization_id]
                # Did B and C both have at least a task per worker queued and not leased yet (A
                # always has)? Then every worker could have taken a task of each organisation.
                backlog = {n: run.created[n] - leased[n] for n in leased}
                run.leases.append((now, name, flood > 0 and all(b >= args.workers for b in backlog.values())))
                if name in leased:
                    leased[name] += 1
                    run.waits[name].append(now - run.queued_at[a.task.id])
                    left[name] -= 1
                    if not any(left.values()):
                        done.set()
                if len(run.leases) >= args.head_start:
                    started.set()
                await asyncio.sleep(task_seconds)
                await lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token, final_batch=FINAL)

        log(f"{args.workers} workers start (fair shares {'on' if fair else 'off'})")
        t0 = time.perf_counter()
        runners = [asyncio.create_task(work(w)) for w in workers]
        if flood:
            await started.wait()
        run.others_queued_at = time.perf_counter()
        await asyncio.gather(queue_tasks(services, orgs["B"], small["B"], run, lanes=args.queue_lanes, name="B"),
                             queue_tasks(services, orgs["C"], small["C"], run, lanes=args.queue_lanes, name="C"))
        await done.wait()
        run.seconds = time.perf_counter() - t0
        await asyncio.gather(*runners)
    finally:
        await pool.close()
    return run


def shares(run: Run, window: int) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Each organisation's share of the leases in windows of ``window`` leases from the moment B
    and C started queueing, and over the leases granted while all three had work (at least a
    queued task per worker each)."""
    after = [name for t, name, _ in run.leases if t >= run.others_queued_at]
    contended = [name for _, name, all_had_work in run.leases if all_had_work]
    windows = [{name: chunk.count(name) / len(chunk) for name in "ABC"}
               for chunk in (after[i:i + window] for i in range(0, len(after), window))]
    overall = {name: contended.count(name) / len(contended) for name in "ABC"} if contended else {}
    return windows, overall


def report_run(label: str, run: Run, args: argparse.Namespace, idle: dict[str, float] | None) -> dict[str, float]:
    d_ms = args.task_ms
    p99s: dict[str, float] = {}
    for name in ("B", "C"):
        waits = [w * 1e3 for w in run.waits[name]]
        p50, p99 = percentile(waits, 50), percentile(waits, 99)
        p99s[name] = p99
        extra = ""
        if idle is not None:
            extra = f" p99_minus_idle_task_durations={(p99 - idle[name]) / d_ms:.1f}"
        print(f"wait {label} org={name} n={len(waits)} p50_ms={p50:.1f} p99_ms={p99:.1f} "
              f"p50_task_durations={p50 / d_ms:.1f} p99_task_durations={p99 / d_ms:.1f}{extra}")
    if label != "idle":
        windows, overall = shares(run, args.window)
        cells = " ".join("/".join(f"{w[n]:.2f}" for n in "ABC") for w in windows[:args.windows_shown])
        more = f" (+{len(windows) - args.windows_shown} windows)" if len(windows) > args.windows_shown else ""
        print(f"shares_over_time {label} window={args.window} A/B/C: {cells}{more}")
        total = sum(args.weight_of.values())
        expected = {n: args.weight_of[n] / total for n in "ABC"}
        deviation = max(abs(overall[n] - expected[n]) / expected[n] for n in "ABC") if overall else math.nan
        contended = sum(1 for *_, all_had_work in run.leases if all_had_work)
        print(f"shares_while_all_have_work {label} leases={contended} A={overall.get('A', math.nan):.3f} "
              f"B={overall.get('B', math.nan):.3f} C={overall.get('C', math.nan):.3f} "
              f"weights={'/'.join(str(args.weight_of[n]) for n in 'ABC')} "
              f"max_relative_deviation={deviation:.3f} within_10_percent={deviation <= 0.10}")
    leases = len(run.leases)
    print(f"run {label} leases={leases} seconds={run.seconds:.1f} leases_per_s={leases / run.seconds:.1f}")
    return p99s


async def acquire_cost(server_url: str, args: argparse.Namespace, organizations: int,
                       busy: int | None = None) -> dict[str, float]:
    """One worker serving ``organizations``, of which the first ``busy`` (None: all) queue tasks."""
    services, pool = await fresh_services(server_url, args.database_name, 2, fair=True)
    busy = organizations if busy is None else min(busy, organizations)
    try:
        registry, lifecycle = services.registry, services.lifecycle
        worker = await registry.register_worker(name="bench-cost", fingerprint=secrets.token_hex(32),
                                                task_types=(TASK_TYPE,), max_concurrent_tasks=1)
        per_org = max(2, math.ceil((args.cost_acquires + args.cost_warmup) / busy) + 1)
        for i in range(organizations):
            org = await registry.create_organization(f"bench-cost-{i}")
            await registry.assign_worker(worker, org)
            if i < busy:
                await queue_tasks(services, org, per_org, lanes=4)
        async with pool.connection() as conn:
            await conn.execute("ANALYZE")
        plan = await candidates_plan(pool, worker)
        latencies = []
        for i in range(args.cost_acquires + args.cost_warmup):
            t0 = time.perf_counter()
            a = await lifecycle.acquire(worker)
            elapsed = time.perf_counter() - t0
            assert a is not None, "nothing to acquire"
            if i >= args.cost_warmup:
                latencies.append(elapsed)
            await lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token, final_batch=FINAL)
    finally:
        await pool.close()
    return {"p50_ms": percentile(latencies, 50) * 1e3, "p99_ms": percentile(latencies, 99) * 1e3,
            "mean_ms": statistics.fmean(latencies) * 1e3, "n": len(latencies), "queued": per_org * busy,
            **plan}


async def served_cost(server_url: str, args: argparse.Namespace, counts: list[int]) -> dict[int, dict[str, float]]:
    """Acquire cost by organisations served, only ``--served-busy`` of them with queued tasks: one
    worker per count in ``counts``, each serving the busy organisations and idle ones up to its
    count, all in one database and timed in turns (worker after worker, the order rotating each
    round), so the machine's load drifts alike for every count and the ratios stay comparable."""
    services, pool = await fresh_services(server_url, args.database_name, 2, fair=True)
    try:
        registry, lifecycle = services.registry, services.lifecycle
        busy_n = max(1, args.served_busy)
        rounds = args.cost_acquires + args.cost_warmup
        per_busy = math.ceil(rounds * len(counts) / busy_n) + 1
        busy = [await registry.create_organization(f"bench-busy-{i}") for i in range(busy_n)]
        idle = [await registry.create_organization(f"bench-idle-{i}") for i in range(max(counts) - 1)]
        workers: dict[int, UUID] = {}
        for n in counts:
            worker = await registry.register_worker(name=f"bench-served-{n}", fingerprint=secrets.token_hex(32),
                                                    task_types=(TASK_TYPE,), max_concurrent_tasks=1)
            served = busy[:n] + idle[:max(0, n - busy_n)]
            for org in served:
                await registry.assign_worker(worker, org)
            workers[n] = worker
        for org in busy:
            await queue_tasks(services, org, per_busy, lanes=4)
        async with pool.connection() as conn:
            await conn.execute("ANALYZE")
        plans = {n: await candidates_plan(pool, w) for n, w in workers.items()}
        latencies: dict[int, list[float]] = {n: [] for n in counts}
        for i in range(rounds):
            turn = counts[i % len(counts):] + counts[:i % len(counts)]
            for n in turn:
                t0 = time.perf_counter()
                a = await lifecycle.acquire(workers[n])
                elapsed = time.perf_counter() - t0
                assert a is not None, "nothing to acquire"
                if i >= args.cost_warmup:
                    latencies[n].append(elapsed)
                await lifecycle.complete(workers[n], a.task.id, a.attempt.id, a.lease_token, final_batch=FINAL)
    finally:
        await pool.close()
    return {n: {"p50_ms": percentile(v, 50) * 1e3, "p99_ms": percentile(v, 99) * 1e3, "n": len(v),
                "queued": per_busy * busy_n, **plans[n]} for n, v in latencies.items()}


async def candidates_plan(pool: Any, worker: UUID) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the organisations' probe as acquire runs it (after
    worker_live_attempts, which sets the plan settings; rolled back): buffers touched, a figure
    the load of the machine cannot skew, and its server time."""
    from leasehold.persistence.queries import QUERIES  # the service's own statements

    async with pool.connection() as conn:
        params = {"worker_id": worker, "now": None}
        # One transaction, as acquire's: the plan settings worker_live_attempts sets are local to it
        # (the pool's connections are in autocommit mode, where they would last one statement).
        await conn.execute("BEGIN")
        await conn.execute(QUERIES["worker_live_attempts"], params)
        cur = await conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ")
                                 + sql.SQL(QUERIES["fair_share_candidates"]), params)
        row = await cur.fetchone()
        await conn.execute("ROLLBACK")
    assert row is not None
    top = row[0][0]
    root = top["Plan"]
    return {"candidates_rows": int(root.get("Actual Rows", 0)),
            "candidates_buffers": int(root.get("Shared Hit Blocks", 0)) + int(root.get("Shared Read Blocks", 0)),
            "candidates_ms": float(top["Execution Time"])}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--database-url", help="maintenance-database URL of the server (default: $BENCH_DATABASE_URL, "
                   "else postgresql://postgres@127.0.0.1:5432/postgres if it answers, else the embedded server)")
    p.add_argument("--database-name", default="leasehold_bench_fair", help="scratch database (dropped and recreated)")
    p.add_argument("--workers", type=int, default=4, help="shared workers, capacity 1 each (default 4)")
    p.add_argument("--flood", type=int, default=10_000, help="tasks A queues first (default 10,000)")
    p.add_argument("--others", type=int, default=100, help="tasks B and C queue each (default 100)")
    p.add_argument("--task-ms", type=float, default=20.0, help="how long a task runs on its worker (default 20)")
    p.add_argument("--head-start", type=int, default=20, help="leases of A's flood before B and C queue")
    p.add_argument("--weights", default="A=1,B=1,C=1", help="fair-share weights (default A=1,B=1,C=1)")
    p.add_argument("--queue-lanes", type=int, default=4, help="concurrent creates while B and C queue (default 4)")
    p.add_argument("--window", type=int, default=30, help="leases per share window (default 30)")
    p.add_argument("--windows-shown", type=int, default=12, help="share windows printed (default 12)")
    p.add_argument("--cost-orgs", default="1,10,100,200",
                   help="organisations per worker for the cost and served sections (default 1,10,100,200)")
    p.add_argument("--served-busy", type=int, default=1,
                   help="organisations with queued tasks in the served section (default 1)")
    p.add_argument("--cost-acquires", type=int, default=300, help="timed acquires per cost case (default 300)")
    p.add_argument("--cost-warmup", type=int, default=20, help="untimed acquires first (default 20)")
    p.add_argument("--skip", action="append", default=[], choices=["idle", "fair", "unfair", "cost", "served"],
                   help="sections to skip (repeatable)")
    args = p.parse_args(argv)
    args.weight_of = {"A": 1, "B": 1, "C": 1}
    for item in args.weights.split(","):
        name, _, weight = item.partition("=")
        if name not in args.weight_of or not weight.isdigit():
            p.error(f"--weights: {item!r} is not NAME=WEIGHT with NAME one of A, B, C")
        args.weight_of[name] = int(weight)
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server_url, source = resolve_server_url(args.database_url)
    load = os.getloadavg()
    print(f"machine cpus={os.cpu_count()} loadavg_at_start={load[0]:.2f},{load[1]:.2f},{load[2]:.2f} "
          f"server={source}")
    print(f"setup workers={args.workers} flood={args.flood} others={args.others} task_ms={args.task_ms:g} "
          f"weights={args.weights}")
    idle: dict[str, float] | None = None
    if "idle" not in args.skip:
        idle = report_run("idle", await scenario(server_url, args, flood=0, fair=True), args, None)
    for label, fair in (("fair", True), ("unfair", False)):
        if label not in args.skip:
            p99 = report_run(label, await scenario(server_url, args, flood=args.flood, fair=fair), args, idle)
            if idle is not None:
                gap = max((p99[n] - idle[n]) / args.task_ms for n in ("B", "C"))
                print(f"goal_p99_within_3_task_durations_of_idle {label} worst={gap:.1f} met={gap <= 3}")
    if "cost" not in args.skip:
        base = None
        for n in (int(x) for x in args.cost_orgs.split(",")):
            log(f"acquire cost, {n} organisations per worker")
            cost = await acquire_cost(server_url, args, n)
            base = base or cost["p50_ms"]
            print(f"acquire_cost organizations={n} queued={cost['queued']} n={cost['n']} p50_ms={cost['p50_ms']:.3f} "
                  f"p99_ms={cost['p99_ms']:.3f} mean_ms={cost['mean_ms']:.3f} ratio_p50_to_first={cost['p50_ms'] / base:.2f} "
                  f"probe_rows={cost['candidates_rows']} probe_buffers={cost['candidates_buffers']} "
                  f"probe_server_ms={cost['candidates_ms']:.3f}")
    if "served" not in args.skip:
        counts = [int(x) for x in args.cost_orgs.split(",")]
        log(f"acquire cost, {counts} organisations per worker, {args.served_busy} with queued tasks, interleaved")
        served = await served_cost(server_url, args, counts)
        first = served[counts[0]]
        for n in counts:
            c = served[n]
            print(f"acquire_served organizations={n} busy={min(args.served_busy, n)} queued={c['queued']} "
                  f"n={c['n']} p50_ms={c['p50_ms']:.3f} p99_ms={c['p99_ms']:.3f} "
                  f"ratio_p50_to_first={c['p50_ms'] / first['p50_ms']:.2f} probe_rows={c['candidates_rows']} "
                  f"probe_buffers={c['candidates_buffers']} "
                  f"ratio_buffers_to_first={c['candidates_buffers'] / max(first['candidates_buffers'], 1):.2f} "
                  f"probe_server_ms={c['candidates_ms']:.3f}")
        last = served[counts[-1]]
        p50_ratio = last["p50_ms"] / first["p50_ms"]
        buffers_ratio = last["candidates_buffers"] / max(first["candidates_buffers"], 1)
        print(f"goal_acquire_p50_at_{counts[-1]}_orgs_within_1.2x_of_{counts[0]} ratio={p50_ratio:.2f} "
              f"met={p50_ratio <= 1.2}")
        print(f"goal_probe_buffers_at_{counts[-1]}_orgs_within_2x_of_{counts[0]} ratio={buffers_ratio:.2f} "
              f"met={buffers_ratio <= 2.0}")
    await asyncio.to_thread(drop_databases, server_url, args.database_name)
    load = os.getloadavg()
    print(f"machine loadavg_at_end={load[0]:.2f},{load[1]:.2f},{load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
