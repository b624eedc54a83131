"""A fleet shaped like a real scanner fleet, against the real Gateway over HTTPS + mTLS.

``leasehold gateway serve`` (one process) on a scratch database; ``--workers`` simulated workers
sharing ``--certs`` client certificates (one registered worker per certificate, serving
``--orgs-per-worker`` of ``--orgs`` organisations, every organisation served), each simulated
worker a loop of the agent's own HTTP client (:class:`worker.client.GatewayClient`, one per
certificate, as one agent with ``max_concurrency`` slots): long-poll ``acquire``, ``progress``,
``renew`` while the plugin "runs", result batches, ``complete`` carrying the final batch.

1. **Idle**: the whole fleet long-polls with nothing queued. Measured over ``--idle-seconds``:
   the database's transactions/s (``pg_stat_database`` of the scratch database, committed and
   rolled back; PostgreSQL publishes a backend's counts up to ~10 s late, so the window is
   preceded by a settle of ``--settle-seconds``) and the CPU of its server processes (``/proc``
   of every backend of that database: the server must be local).
2. **Load**: ``--scans`` scans of a 3-step profile (discover, probe, inspect), spread over the
   organisations; the first step over a /20 reports ``--assets`` assets (default 4,096) in batches
   of ``--batch`` as the agent would, the next steps' scopes are those assets. Plugin run times
   are Pareto-distributed (5 s to 600 s, alpha 1.5: mostly seconds, sometimes minutes),
   multiplied by ``--time-scale``. ``--kills`` workers die mid-attempt (they stop renewing and
   never answer: the sweeper must reissue their tasks once the lease lapses) and come back; the
   Gateway is restarted once (SIGTERM, a new process on the same ports) when
   ``--restart-at`` of the tasks are done. An operator reads ``GET /v1/scans`` and
   ``GET /v1/workers`` every 100 ms throughout.

It prints ``name value`` lines: ``idle_xact_per_s``, ``idle_pg_cpu`` (cores), ``idle_long_polls``,
``no_polls_xact_per_s``/``no_polls_pg_cpu`` (the same window before any worker connects: what the
Gateway's own background loops cost),
``acquire/renew/results/complete_p50_ms``/``_p99_ms`` (acquire: a probe worker serving every
organisation acquires without a long-poll every 100 ms, a full poll that finds nothing it can
take; ``acquire_leased``: the fleet's long-polls that returned a
lease, begun while tasks were queued), ``idle_operator_p99_ms`` (an operator reading
``GET /v1/scans`` and ``GET /v1/workers`` every 100 ms for ``--idle-seconds`` while the fleet's
long-polls wait, right after the idle window: the issue's bar), ``operator_p99_ms`` (the same
reads throughout the load phase; errors while the Gateway restarts are counted apart), ``gateway_rss_start/end_mib`` (start: the first
process with the fleet waiting, end: the process after the restart, at the end),
``scans_finished``/``scans_expected``, ``tasks_lost`` (tasks of the scans that never succeeded),
``tasks_run_twice`` (tasks with more than one completion accepted), ``share_min_ratio``/
``share_max_ratio`` (leases per organisation over the first half of the run, against an equal
share), and one ``goal_<name> value target met=True|False`` line per bar of issue 26.

    .venv/bin/python bench/fleet.py                 # the real shape (minutes, heavy on 2 cores)
    .venv/bin/python bench/fleet.py --smoke         # seconds

It drops and recreates ``leasehold_fleet_bench`` (``--database-name``) and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import random
import secrets
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import aiohttp
import orjson
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from common import percentile, recreate_database, resolve_server_url  # noqa: E402
from gateway_lifecycle import free_port  # noqa: E402

from leasehold.cli.dev_ca import init_pki, issue_worker_certificate  # noqa: E402
from leasehold.domain.events import ProfileStep  # noqa: E402
from leasehold.domain.results import payload_sha256  # noqa: E402
from leasehold.domain.targets import parse_policy  # noqa: E402
from leasehold.gateway.services import build_services  # noqa: E402
from leasehold.gateway.tls import PkiPaths  # noqa: E402
from leasehold.migrations import runner as migrate  # noqa: E402
from leasehold.persistence.connection import create_pool  # noqa: E402
from leasehold.persistence.transaction import Database  # noqa: E402
from leasehold.worker.batcher import Batch  # noqa: E402
from leasehold.worker.client import AttemptRef, GatewayClient, GatewayError, Rejected  # noqa: E402
from leasehold.worker.settings import WorkerSettings  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
STEPS = ("discover", "probe", "inspect")
MIB = 1024 * 1024


# --------------------------------------------------------------------------- the Gateway process


class Gateway:
    """``leasehold gateway serve`` on fixed ports (a restart keeps them)."""

    def __init__(self, url: str, pki: PkiPaths, admin_key: str, settings: dict[str, Any]) -> None:
        self.url, self.pki, self.admin_key, self.settings = url, pki, admin_key, settings
        self.worker_port, self.operator_port = free_port(), free_port()
        self.ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "leasehold.cli.main", "gateway", "serve", "--database-url", self.url,
               "--pki-dir", str(self.pki.directory), "--worker-port", str(self.worker_port),
               "--operator-port", str(self.operator_port), "--log-level", "WARNING"]
        for name, value in self.settings.items():
            cmd += ["--" + name.replace("_", "-"), str(value)]
        env = {**os.environ, "LEASEHOLD_ADMIN_API_KEY": self.admin_key}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ctx)) as s, \
                s.get(f"https://localhost:{self.operator_port}{path}") as r:
            return r.status, await r.text()

    async def ready(self) -> None:
        async with asyncio.timeout(90):
            while True:
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    status, text = await self.get("/readyz")
                    if status == 200 and orjson.loads(text)["listening"]:
                        return
                await asyncio.sleep(0.2)

    async def waiting(self) -> float:
        with contextlib.suppress(aiohttp.ClientError, OSError, StopIteration):
            _, text = await self.get("/metrics")
            return next(float(line.split()[1]) for line in text.splitlines()
                        if line.startswith("leasehold_long_polls_waiting "))
        return 0.0

    def rss_mib(self) -> float:
        """Resident memory of the Gateway process (and its children: ``serve`` may fork)."""
        assert self.proc is not None
        total = 0
        for pid in [self.proc.pid, *_children(self.proc.pid)]:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        return total / 1024

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


# --------------------------------------------------------------------------- the fleet


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    completed: Counter[UUID] = field(default_factory=Counter)
    leases: list[tuple[float, UUID]] = field(default_factory=list)
    kills_left: int = 0
    #: Tasks that can be leased now, as the monitor last counted them.
    backlog: int = 0
    killed: int = 0
    lost_leases: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def timed(self, name: str, started: float) -> None:
        self.latencies[name].append((time.perf_counter() - started) * 1000)


def run_seconds(rng: random.Random, scale: float) -> float:
    """A plugin's run time: Pareto (5 s minimum, alpha 1.5) capped at 600 s, times ``scale``."""
    return min(600.0, 5.0 * rng.paretovariate(1.5)) * scale


def assets(count: int, scope: dict[str, Any]) -> list[dict[str, Any]]:
    """What discovery over the scan's /20 finds: ``count`` services on its hosts."""
    network = ipaddress.ip_network(scope["targets"][0])
    return [{"type": "asset", "kind": "service", "value": f"{network[n % network.num_addresses]}:{443 + n // 4096}/tcp"}
            for n in range(count)]


async def simulated_worker(n: int, client: GatewayClient, args: argparse.Namespace, stats: Stats,
                           stop: asyncio.Event, rng: random.Random) -> None:
    """One slot of an agent: acquire, run, report, complete; now and then it dies mid-attempt."""
    while not stop.is_set():
        started, backlog = time.perf_counter(), stats.backlog
        try:
            answer = await client.acquire(uuid4().hex, wait_seconds=args.wait_seconds, stop=stop)
        except GatewayError:
            if stop.is_set():
                return
            stats.errors["acquire"] += 1
            continue
        if answer.lease is None:
            continue
        if backlog > 0:  # begun while tasks were queued (it may still have waited for one)
            stats.timed("acquire_leased", started)
        lease = answer.lease
        stats.leases.append((time.monotonic(), lease.task.id))
        ref = AttemptRef(lease.task.id, lease.attempt_id, lease.lease_token)
        renewing: asyncio.Task[None] | None = None
        try:
            await client.progress(ref, stop=stop)
            if stats.kills_left > 0 and rng.random() < args.kill_chance:
                stats.kills_left -= 1
                stats.killed += 1
                # Killed: no renew, no answer; the sweeper reissues the task once its lease lapses.
                await asyncio.sleep(run_seconds(rng, args.time_scale))
                continue
            # As the agent: the lease is renewed in the background for the whole attempt.
            renewing = asyncio.create_task(renewer(client, ref, args.renew_every, stats, stop))
            await asyncio.sleep(run_seconds(rng, args.time_scale))
            records = (assets(args.assets, lease.task.scope) if lease.task.task_type == STEPS[0]
                       else [{"type": "finding", "title": f"{lease.task.task_type} {i}"} for i in range(3)])
            chunks = [records[i:i + args.batch] for i in range(0, len(records), args.batch)]
            for seq, chunk in enumerate(chunks[:-1], 1):
                started = time.perf_counter()
                await client.submit(ref, sequence_number=seq, idempotency_key=f"{lease.attempt_id}-{seq}",
                                    payload_sha256=payload_sha256(chunk), payload=chunk, final=False, stop=stop)
                stats.timed("results", started)
            last = chunks[-1]
            started = time.perf_counter()
            await client.complete(ref, final_batch=Batch(len(chunks), f"{lease.attempt_id}-{len(chunks)}", last,
                                                         payload_sha256(last), True), stop=stop)
            stats.timed("complete", started)
            stats.completed[lease.task.id] += 1
        except Rejected as exc:
            stats.lost_leases += 1  # the lease lapsed or the task was cancelled: the fence held
            if exc.status != 409:
                stats.errors[f"rejected_{exc.status}_{exc.code}"] += 1
        except GatewayError:
            if stop.is_set():
                return
            stats.errors["write"] += 1
        finally:
            if renewing is not None:
                renewing.cancel()
                await asyncio.gather(renewing, return_exceptions=True)


async def renewer(client: GatewayClient, ref: AttemptRef, every: float, stats: Stats, stop: asyncio.Event) -> None:
    while True:
        await asyncio.sleep(every)
        started = time.perf_counter()
        try:
            await client.renew(ref, stop=stop)
        except GatewayError:
            return  # the attempt's own writes say what happened
        stats.timed("renew", started)


async def acquire_probe(client: GatewayClient, stop: asyncio.Event, stats: Stats) -> None:
    """An acquire without a long-poll every 100 ms by a worker serving every organisation, none
    of whose tasks it can take: what one acquire (a full poll) costs while the fleet runs."""
    while not stop.is_set():
        started = time.perf_counter()
        with contextlib.suppress(GatewayError):
            await client.acquire(uuid4().hex, wait_seconds=0, stop=stop)
            stats.timed("acquire", started)
        await asyncio.sleep(0.1)


async def operator_loop(gw: Gateway, stop: asyncio.Event, stats: Stats, key: str = "operator") -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=gw.ctx),
                                     headers={"Authorization": f"Bearer {gw.admin_key}"}) as s:
        paths = ("/v1/scans?limit=20", "/v1/workers?limit=20")
        n = 0
        while not stop.is_set():
            n += 1
            started = time.perf_counter()
            try:
                async with s.get(f"https://localhost:{gw.operator_port}{paths[n % 2]}") as r:
                    await r.read()
                    if r.status == 200:
                        stats.timed(key, started)
                    else:
                        stats.errors[f"{key}_{r.status}"] += 1
            except (aiohttp.ClientError, OSError):
                stats.errors[f"{key}_down"] += 1
            await asyncio.sleep(0.1)


# --------------------------------------------------------------------------- the database side


async def database_counters(conn: psycopg.AsyncConnection[Any], name: str) -> tuple[int, float]:
    """(transactions so far, CPU seconds of the database's server processes so far)."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (name,))
    row = await cur.fetchone()
    assert row is not None
    cur = await conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                             (name,))
    cpu = sum(_cpu_seconds(pid) for (pid,) in await cur.fetchall())
    return int(row[0]), cpu


async def setup(url: str, pki: PkiPaths, args: argparse.Namespace, rng: random.Random,
                ) -> tuple[list[UUID], list[tuple[Path, Path]]]:
    pool = create_pool(url, min_size=1, max_size=4)
    await pool.open()
    try:
        s = build_services(Database(pool))
        orgs = [await s.registry.create_organization(f"org-{i}") for i in range(args.orgs)]
        policy = parse_policy(allow=["10.0.0.0/8"])
        for org in orgs:
            await s.registry.set_target_policy(org, policy)
        per_cert = -(-args.workers // args.certs)
        certs = []
        for i in range(args.certs):
            name = f"fleet-{i}"
            cert = issue_worker_certificate(pki.directory, name)
            worker = await s.registry.register_worker(name=name, fingerprint=cert.fingerprint, task_types=STEPS,
                                                      max_concurrent_tasks=per_cert)
            # Consecutive organisations, so that together the workers serve every one.
            for k in range(min(args.orgs_per_worker, args.orgs)):
                await s.registry.assign_worker(worker, orgs[(i * args.orgs_per_worker + k) % args.orgs])
            certs.append((cert.cert_path, cert.key_path))
        cert = issue_worker_certificate(pki.directory, "fleet-probe")
        worker = await s.registry.register_worker(name="fleet-probe", fingerprint=cert.fingerprint,
                                                  task_types=("nothing-queued",), max_concurrent_tasks=1)
        for org in orgs:
            await s.registry.assign_worker(worker, org)
        certs.append((cert.cert_path, cert.key_path))  # the last one: the probe's
        return orgs, certs
    finally:
        await pool.close()


async def create_scans(url: str, orgs: list[UUID], args: argparse.Namespace) -> list[UUID]:
    pool = create_pool(url, min_size=1, max_size=4)
    await pool.open()
    try:
        s = build_services(Database(pool))
        steps = tuple(ProfileStep(task_type=t, lease_seconds=args.lease_seconds) for t in STEPS)
        scans = []
        started = time.monotonic()
        for i in range(args.scans):
            org = orgs[i % len(orgs)]
            scans.append(await s.scans.create_scan(org, {"targets": [f"10.{(i % 250) + 1}.0.0/20"]}, profile=steps))
            # Scans arrive over --scan-spread seconds, not all at once.
            await asyncio.sleep(max(0.0, started + args.scan_spread * (i + 1) / args.scans - time.monotonic()))
        return scans
    finally:
        await pool.close()


async def backlog(conn: psycopg.AsyncConnection[Any], scans: list[UUID]) -> int:
    cur = await conn.execute("SELECT count(*) FROM worker_tasks WHERE scan_id = ANY(%s) AND state IN ('pending', "
                             "'retry_wait') AND available_at <= now()", (scans,))
    return int((await cur.fetchone() or (0,))[0])


@dataclass
class Outcome:
    finished: int  # scans that ended (succeeded or not)
    succeeded: int  # scans that succeeded
    completed: int  # tasks completed
    failed: int  # tasks failed (attempts exhausted: e.g. leases that lapsed on an overloaded box)
    unfinished: int  # tasks in no final state
    organization_of: dict[UUID, UUID]


async def outcome(conn: psycopg.AsyncConnection[Any], scans: list[UUID]) -> Outcome:
    cur = await conn.execute("SELECT count(*) FILTER (WHERE status IN ('success', 'failed', 'cancelled')), "
                             "count(*) FILTER (WHERE status = 'success') FROM scans WHERE id = ANY(%s)", (scans,))
    finished, succeeded = await cur.fetchone() or (0, 0)
    cur = await conn.execute("SELECT id, organization_id, state FROM worker_tasks WHERE scan_id = ANY(%s)", (scans,))
    rows = await cur.fetchall()
    states = Counter(r[2] for r in rows)
    return Outcome(finished, succeeded, states["completed"], states["failed_terminal"],
                   sum(n for state, n in states.items() if state not in ("completed", "failed_terminal", "cancelled")),
                   {r[0]: r[1] for r in rows})


# --------------------------------------------------------------------------- the run


async def run(url: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    out: dict[str, Any] = {"time_scale": args.time_scale, "workers": args.workers, "certs": args.certs,
                           "orgs": args.orgs, "orgs_per_worker": args.orgs_per_worker, "scans_expected": args.scans}
    stats = Stats(kills_left=args.kills)
    with tempfile.TemporaryDirectory() as tmp:
        pki = init_pki(Path(tmp) / "pki")
        orgs, certs = await setup(url, pki, args, rng)
        gw = Gateway(url, pki, secrets.token_hex(16), {"pool_size": args.pool_size})
        gw.start()
        stop = asyncio.Event()
        clients: list[GatewayClient] = []
        tasks: list[asyncio.Task[None]] = []
        try:
            await gw.ready()
            # 0. The same Gateway with no long-poll at all: what its own background loops cost.
            await asyncio.sleep(args.settle_seconds)
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                xact0, cpu0 = await database_counters(conn, name)
                t0 = time.monotonic()
                await asyncio.sleep(args.idle_seconds)
                xact1, cpu1 = await database_counters(conn, name)
                seconds = time.monotonic() - t0
            out["no_polls_xact_per_s"] = round(max(0, xact1 - xact0 - 2) / seconds, 2)
            out["no_polls_pg_cpu"] = round((cpu1 - cpu0) / seconds, 4)
            per_cert = -(-args.workers // args.certs)
            certs, (probe_cert, probe_key) = certs[:-1], certs[-1]
            probe = await GatewayClient(WorkerSettings(
                gateway=f"https://localhost:{gw.worker_port}", cert=probe_cert, key=probe_key, ca=pki.ca_cert,
                backoff_initial_seconds=0.2, backoff_max_seconds=2.0)).__aenter__()
            clients.append(probe)
            for cert, key in certs:
                settings = WorkerSettings(gateway=f"https://localhost:{gw.worker_port}", cert=cert, key=key,
                                          ca=pki.ca_cert, max_concurrency=per_cert, wait_seconds=args.wait_seconds,
                                          backoff_initial_seconds=0.2, backoff_max_seconds=2.0)
                clients.append(await GatewayClient(settings).__aenter__())
            fleet = clients[1:]
            for n in range(args.workers):
                tasks.append(asyncio.create_task(simulated_worker(
                    n, fleet[n % len(fleet)], args, stats, stop, random.Random(rng.random()))))
            # 1. Idle: everyone waiting, nothing queued.
            async with asyncio.timeout(300):
                while await gw.waiting() < args.workers:  # noqa: ASYNC110 (a metric of another process)
                    await asyncio.sleep(0.5)
            await asyncio.sleep(args.settle_seconds)  # PostgreSQL publishes a backend's counts late
            out["idle_long_polls"] = int(await gw.waiting())
            out["gateway_rss_start_mib"] = round(gw.rss_mib(), 1)
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                xact0, cpu0 = await database_counters(conn, name)
                t0 = time.monotonic()
                await asyncio.sleep(args.idle_seconds)
                xact1, cpu1 = await database_counters(conn, name)
                seconds = time.monotonic() - t0
                # Less this measuring connection's own two statements (autocommit: two transactions).
                out["idle_xact_per_s"] = round(max(0, xact1 - xact0 - 2) / seconds, 2)
                out["idle_pg_cpu"] = round((cpu1 - cpu0) / seconds, 4)
                out["idle_seconds"] = round(seconds, 1)
                # The operator's requests while the fleet waits (measured after the idle window,
                # whose transaction count they would otherwise add to).
                idle_stop = asyncio.Event()
                idle_operator = asyncio.create_task(operator_loop(gw, idle_stop, stats, key="idle_operator"))
                await asyncio.sleep(args.idle_seconds)
                idle_stop.set()
                await idle_operator

                # 2. Load.
                operator = asyncio.create_task(operator_loop(gw, stop, stats))
                probing = asyncio.create_task(acquire_probe(probe, stop, stats))
                started = time.monotonic()
                stats.backlog = 1  # the first steps' tasks, queued as the scans arrive
                scans = await create_scans(url, orgs, args)
                expected_tasks = len(scans) * len(STEPS)
                restarted = False
                half_at: float | None = None
                while True:
                    now = await outcome(conn, scans)
                    stats.backlog = await backlog(conn, scans)
                    if half_at is None and now.completed >= expected_tasks / 2:
                        half_at = time.monotonic()
                    if not restarted and now.completed + now.failed >= expected_tasks * args.restart_at:
                        out["gateway_rss_before_restart_mib"] = round(gw.rss_mib(), 1)
                        restart_started = time.monotonic()
                        gw.stop()
                        gw.start()
                        await gw.ready()
                        out["gateway_restart_s"] = round(time.monotonic() - restart_started, 1)
                        restarted = True
                    if now.finished >= len(scans) or time.monotonic() - started > args.timeout:
                        break
                    await asyncio.sleep(0.5)
                out["load_s"] = round(time.monotonic() - started, 1)
                out["gateway_rss_end_mib"] = round(gw.rss_mib(), 1)
                stop.set()
                await operator
                await probing
                end = await outcome(conn, scans)
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for client in clients:
                await client.close()
            gw.stop()
    out["scans_finished"] = end.finished
    out["scans_succeeded"] = end.succeeded
    out["tasks_expected"] = expected_tasks
    out["tasks_completed"] = end.completed
    out["tasks_failed"] = end.failed
    # Lost: a task of a scan that ended left in no final state (its work neither done nor refused).
    out["tasks_lost"] = end.unfinished
    out["tasks_run_twice"] = sum(1 for c in stats.completed.values() if c > 1)
    out["workers_killed"] = stats.killed
    out["leases_lost_by_workers"] = stats.lost_leases
    out["client_errors"] = dict(stats.errors) or 0
    for op in ("acquire", "acquire_leased", "renew", "results", "complete", "idle_operator", "operator"):
        values = stats.latencies.get(op, [])
        out[f"{op}_count"] = len(values)
        if values:
            out[f"{op}_p50_ms"] = round(percentile(values, 50), 1)
            out[f"{op}_p99_ms"] = round(percentile(values, 99), 1)
    # Shares: leases per organisation over the first half of the run, against an equal share.
    cut = half_at if half_at is not None else float("inf")
    per_org = Counter(end.organization_of.get(task) for at, task in stats.leases if at <= cut)
    per_org.pop(None, None)
    if per_org:
        fair = sum(per_org.values()) / len(orgs)
        ratios = [per_org.get(o, 0) / fair for o in orgs]
        out["share_min_ratio"], out["share_max_ratio"] = round(min(ratios), 2), round(max(ratios), 2)
    return out


def goals(out: dict[str, Any]) -> list[str]:
    bars = [("idle_xact_per_s", out["idle_xact_per_s"], "<=5", out["idle_xact_per_s"] <= 5),
            # The bar: an operator's request while the fleet's long-polls wait. Under the full
            # load (operator_p99_ms, printed too) it is not a bar of the issue.
            ("idle_operator_p99_ms", out.get("idle_operator_p99_ms", float("inf")), "<=50",
             out.get("idle_operator_p99_ms", float("inf")) <= 50),
            ("tasks_lost_or_run_twice", out["tasks_lost"] + out["tasks_run_twice"], "==0",
             out["tasks_lost"] + out["tasks_run_twice"] == 0),
            ("scans_succeeded", f"{out['scans_succeeded']}/{out['scans_expected']}", "all",
             out["scans_succeeded"] == out["scans_expected"]),
            ("rss_end_over_start", round(out["gateway_rss_end_mib"] / out["gateway_rss_start_mib"], 2), "<=1.2",
             out["gateway_rss_end_mib"] <= 1.2 * out["gateway_rss_start_mib"])]
    return [f"goal_{name} {value} {target} met={met}" for name, value, target, met in bars]


SMOKE = {"workers": 40, "certs": 4, "orgs": 8, "orgs_per_worker": 4, "scans": 8, "assets": 300, "batch": 100,
         "time_scale": 0.002, "kills": 2, "idle_seconds": 2.0, "settle_seconds": 1.0, "lease_seconds": 5, "renew_every": 1.0, "scan_spread": 2.0,
         "timeout": 120.0, "wait_seconds": 5}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=1000, help="simulated workers (agent slots)")
    p.add_argument("--certs", type=int, default=50, help="client certificates (registered workers) they share")
    p.add_argument("--orgs", type=int, default=200)
    p.add_argument("--orgs-per-worker", type=int, default=50)
    p.add_argument("--scans", type=int, default=200, help="3-step profile scans, spread over the organisations")
    p.add_argument("--assets", type=int, default=4096, help="assets the first step of each scan finds (a /20)")
    p.add_argument("--batch", type=int, default=200, help="records per result batch (the agent's default)")
    p.add_argument("--time-scale", type=float, default=0.01, help="plugin run time multiplier")
    p.add_argument("--kills", type=int, default=20, help="workers that die mid-attempt")
    p.add_argument("--kill-chance", type=float, default=0.05, help="chance a lease is abandoned while kills remain")
    p.add_argument("--restart-at", type=float, default=0.4, help="restart the Gateway when this share of tasks is done")
    p.add_argument("--lease-seconds", type=int, default=60, help="lease of the profile's tasks")
    p.add_argument("--renew-every", type=float, default=15.0)
    p.add_argument("--scan-spread", type=float, default=60.0, help="seconds over which the scans arrive")
    p.add_argument("--wait-seconds", type=int, default=20, help="the agents' long-poll time")
    p.add_argument("--idle-seconds", type=float, default=30.0, help="the idle measurement window")
    p.add_argument("--settle-seconds", type=float, default=12.0, help="before the idle window")
    p.add_argument("--timeout", type=float, default=1800.0, help="give up on unfinished scans after this")
    p.add_argument("--pool-size", type=int, default=20, help="the Gateway's database connections")
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--smoke", action="store_true", help="a shape that runs in seconds (the suite's smoke test)")
    p.add_argument("--database-url", help="maintenance database URL of the server to use (must be local: /proc)")
    p.add_argument("--database-name", default="leasehold_fleet_bench")
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            if p.get_default(key) == getattr(args, key):
                setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The agents' retry lines while the Gateway restarts are expected; the summary counts them.
    logging.basicConfig(level=logging.ERROR)
    server, source = resolve_server_url(args.database_url)
    load = ",".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine cpus={os.cpu_count()} load_average={load} server={source.replace(' ', '_')}")
    url = recreate_database(server, args.database_name)
    try:
        migrate.upgrade(url, "head")
        out = asyncio.run(run(url, args.database_name, args))
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.database_name)))
    for key, value in out.items():
        text = orjson.dumps(value).decode() if isinstance(value, dict) else value
        print(f"{key} {text}")
    for line in goals(out):
        print(line)
    load = ",".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine_end load_average={load}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
