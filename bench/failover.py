"""Failover soak: workers and a feeder under load while the primary PostgreSQL fails over, again and again.

Everything is real and local: a Patroni cluster of this run's own (``tests/support/patroni.py``:
etcd, two PostgreSQL 15 nodes, ``synchronous_mode: true``, ``synchronous_commit = on``), a
``leasehold gateway serve`` process whose ``--database-url`` is the cluster's multi-host URL
(``target_session_attrs=read-write``), K ``leasehold worker run`` processes running the chaos
plugin (``bench/chaos_plugin.py``, which records every execution), and a feeder creating M
tasks over the fault window — the machinery of ``bench/chaos.py``, with failovers as its faults:

======================  =======================================================================
node_kill               SIGKILL the leader's patroni and postgres (the machine dies): its leader
                        key expires (ttl) and Patroni promotes the synchronous standby; the dead
                        node is started again and rejoins as the new standby (``pg_rewind``)
switchover              ``patronictl switchover`` to the synchronous standby (planned)
postgres_kill_failover  SIGKILL the leader's postmaster, then ``patronictl failover`` to the
                        standby (retried while Patroni is still restarting the killed server)
======================  =======================================================================

Optionally (``--storm-seconds``) a ``pg_terminate_backend`` storm follows: every backend of the
run's database (the Gateway's pool, its LISTEN connection, the plugins' writes) terminated every
0.3 s for that long, on the primary that stays primary; and (``--exhaust-seconds``) the
primary's connection slots exhausted: the run database's backends terminated, then every free
slot of ``max_connections`` taken and held for that long, so the Gateway cannot reconnect until
they are released.

One fault at a time, in that order, round after round, until ``--failovers`` primary changes
have happened; after each, the cluster must be whole again (a leader and its synchronous
standby) before the next. Per fault it measures: seconds until the multi-host URL reaches a
writable server, until the first task completes after the fault (the whole path: Gateway,
workers, database), and until the cluster is whole again. Then it drains, and checks per task
(``bench/chaos.py``'s checker: lost, completed twice, a write from a fenced attempt accepted,
ingested twice, stuck, an attempt run twice), ``leasehold replay verify`` (a rebuild equals the
live projections) and ``verify-chain`` (the hash chain unbroken); it exits 0 only when all hold.

Usage::

    .venv/bin/python bench/failover.py                    # 5 failovers, 4 workers, 600 tasks
    .venv/bin/python bench/failover.py --failovers 2 --tasks 120 --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import chaos
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.patroni import PatroniCluster, patroni_available, patroni_cluster, wait_writable  # noqa: E402

KINDS = ("node_kill", "switchover", "postgres_kill_failover")


@dataclass
class Recovery:
    """One fault and how long each part of the system took to come back."""

    number: int
    kind: str
    old_leader: str
    new_leader: str
    writable_s: float
    completions_resume_s: float | None
    whole_s: float


class _ClusterServer:
    """What ``chaos.provision`` asks of a server: its maintenance URL."""

    def __init__(self, cluster: PatroniCluster) -> None:
        self.cluster = cluster

    def url(self) -> str:
        return self.cluster.url("postgres")


async def _succeeded(run: chaos.Run) -> int:
    rows = await chaos.patiently("count", lambda: run.rows(
        "SELECT count(*) FROM worker_task_attempts WHERE status = 'succeeded'"))
    return int(rows[0][0])


async def _completion_after(run: chaos.Run, before: int, within: float) -> float | None:
    """Seconds until a task completes that had not before (None: none within ``within``)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        try:
            if await _succeeded(run) > before:
                return time.monotonic() - started
        except RuntimeError:
            pass
        await asyncio.sleep(0.2)
    return None


async def inject(run: chaos.Run, cluster: PatroniCluster, kind: str, number: int) -> Recovery:
    leader = await asyncio.to_thread(cluster.wait_healthy)
    before = await _succeeded(run)
    started = time.monotonic()
    if kind == "node_kill":
        dead = await asyncio.to_thread(cluster.kill_leader_node)
    elif kind == "switchover":
        dead = None
        await asyncio.to_thread(cluster.switchover)
    else:
        dead = None
        await asyncio.to_thread(cluster.kill_postgres_and_fail_over)
    await asyncio.to_thread(wait_writable, cluster.url(chaos.DATABASE), 120.0)
    writable_s = time.monotonic() - started
    new = await asyncio.to_thread(cluster.wait_leader, 120.0)
    if dead is not None:
        cluster.start_node(dead)
    resumed = await _completion_after(run, before, 120.0)
    resumed_s = None if resumed is None else time.monotonic() - started  # since the fault
    await asyncio.to_thread(cluster.wait_healthy, 180.0)
    whole_s = time.monotonic() - started
    recovery = Recovery(number, kind, leader.name, new.name, round(writable_s, 1),
                        None if resumed_s is None else round(resumed_s, 1), round(whole_s, 1))
    chaos.log(f"fault {number} {kind}: {leader.name} -> {new.name}; writable after {writable_s:.1f}s, "
              f"a completion after {resumed_s if resumed_s is None else round(resumed_s, 1)}s, "
              f"whole after {whole_s:.1f}s")
    return recovery


async def faults(run: chaos.Run, cluster: PatroniCluster, settings: argparse.Namespace) -> list[Recovery]:
    recoveries: list[Recovery] = []
    number = 0
    while sum(1 for r in recoveries if r.old_leader != r.new_leader) < settings.failovers:
        kind = settings.kinds[number % len(settings.kinds)]
        number += 1
        recoveries.append(await inject(run, cluster, kind, number))
        await asyncio.sleep(settings.pause_seconds)
    return recoveries


async def storm(run: chaos.Run, cluster: PatroniCluster, seconds: float) -> dict[str, Any]:
    """``pg_terminate_backend`` of every other backend of the database, every 0.3 s."""
    leader = await asyncio.to_thread(cluster.wait_healthy)
    before = await _succeeded(run)
    terminated = rounds = 0
    started = time.monotonic()
    async with await psycopg.AsyncConnection.connect(leader.url(chaos.DATABASE), autocommit=True) as conn:
        while time.monotonic() - started < seconds:
            cur = await conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()")
            row = await cur.fetchone()
            terminated += int(row[0]) if row else 0
            rounds += 1
            await asyncio.sleep(0.3)
    ended = time.monotonic()
    resumed = await _completion_after(run, before, 120.0)
    result = {"seconds": round(ended - started, 1), "rounds": rounds, "terminated": terminated,
              "completed_during": await _succeeded(run) - before,
              "completion_after_end_s": None if resumed is None else round(time.monotonic() - ended, 1)}
    chaos.log(f"terminate storm: {result}")
    return result


async def exhaust(run: chaos.Run, cluster: PatroniCluster, seconds: float) -> dict[str, Any]:
    """Terminate the database's backends, take every free connection slot, hold them ``seconds``."""
    leader = await asyncio.to_thread(cluster.wait_healthy)
    before = await _succeeded(run)
    holders: list[psycopg.AsyncConnection[Any]] = []
    started = time.monotonic()
    try:
        async with await psycopg.AsyncConnection.connect(leader.url(chaos.DATABASE), autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                " WHERE datname = current_database() AND pid <> pg_backend_pid()")
        while len(holders) < 500:
            try:
                holders.append(await psycopg.AsyncConnection.connect(leader.url(), autocommit=True,
                                                                     connect_timeout=2))
            except psycopg.OperationalError:
                break
        others = -1
        if holders:
            cur = await holders[0].execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                           (chaos.DATABASE,))
            row = await cur.fetchone()
            others = int(row[0]) if row else 0
        await asyncio.sleep(seconds)
    finally:
        for conn in holders:
            await conn.close()
    ended = time.monotonic()
    resumed = await _completion_after(run, before, 120.0)
    result = {"seconds": round(ended - started, 1), "slots_held": len(holders),
              "run_database_backends_while_held": others, "completed_during": await _succeeded(run) - before,
              "completion_after_release_s": None if resumed is None else round(time.monotonic() - ended, 1)}
    chaos.log(f"connection exhaustion: {result}")
    return result


async def http_5xx(run: chaos.Run) -> dict[str, int]:
    """The Gateway's 5xx answers by route, from its ``/metrics``."""
    import ssl

    import aiohttp

    ctx = ssl.create_default_context(cafile=str(run.gateway.pki_dir / "ca.pem"))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session, session.get(
                f"https://localhost:{run.gateway.operator_port}/metrics") as r:
            text = await r.text()
    except (aiohttp.ClientError, OSError):
        return {"unknown": -1}
    found: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("leasehold_http_requests_total{") and 'status="5' in line:
            labels, value = line.rsplit(" ", 1)
            route = labels.split('route="', 1)[1].split('"', 1)[0]
            status = labels.split('status="', 1)[1].split('"', 1)[0]
            found[f"{status} {route}"] = found.get(f"{status} {route}", 0) + int(float(value))
    return found


async def soak(settings: argparse.Namespace, workdir: Path, cluster: PatroniCluster) -> dict[str, Any]:
    run = await chaos.provision(settings, workdir, _ClusterServer(cluster))  # type: ignore[arg-type]
    started = time.monotonic()
    helpers: list[asyncio.Task[None]] = []
    fivexx: dict[str, int] = {}
    try:
        await chaos.start_gateway(run)
        for worker in run.workers:
            await worker.start()
        chaos.log(f"{settings.workers} workers, {settings.tasks} tasks, {settings.failovers} failovers "
                  f"(lease {settings.lease_seconds}s); logs in {workdir}")
        helpers = [asyncio.create_task(chaos.watch(run)), asyncio.create_task(chaos.progress(run, started))]
        feeder = asyncio.create_task(chaos.feed(run, settings.feed_seconds))
        await asyncio.sleep(settings.warmup_seconds)
        recoveries = await faults(run, cluster, settings)
        stormed = await storm(run, cluster, settings.storm_seconds) if settings.storm_seconds > 0 else None
        exhausted = await exhaust(run, cluster, settings.exhaust_seconds) if settings.exhaust_seconds > 0 else None
        fault_window = time.monotonic() - started
        await feeder
        chaos.log(f"faults over after {fault_window:.0f}s; draining")
        drain_seconds = await chaos.drain(run, settings.drain_seconds)
        fivexx = await http_5xx(run)
        for helper in helpers:
            helper.cancel()
        exits = [await w.stop(30) for w in run.workers]
        await run.gateway.stop()
        total = time.monotonic() - started
        async with await psycopg.AsyncConnection.connect(run.database_url) as conn:
            result = await chaos.check(conn, settings.tasks)
        verify, chain = chaos.replay("verify", run.database_url), chaos.replay("verify-chain", run.database_url)
    finally:
        for helper in helpers:
            helper.cancel()
        for worker in run.workers:
            if worker.process is not None and worker.process.returncode is None:
                await worker.kill()
        await run.gateway.kill()
        for proxy in run.proxies:
            await proxy.aclose()
        await run.pool.close()
    failovers = sum(1 for r in recoveries if r.old_leader != r.new_leader)
    ok = (all(v == 0 for v in result["counts"].values()) and verify.get("ok") is True and chain.get("ok") is True
          and drain_seconds != float("inf") and result["tasks"] >= settings.tasks
          and failovers >= settings.failovers)
    return {
        "ok": ok, "workers": settings.workers, "tasks": settings.tasks, "lease_seconds": settings.lease_seconds,
        "failovers": failovers, "recoveries": [asdict(r) for r in recoveries], "counts": result["counts"],
        "examples": result["examples"], "completed": result["completed"], "effects": result["effects"],
        "notes": dict(sorted(run.notes.items())), "gateway_5xx": fivexx, "storm": stormed,
        "exhaustion": exhausted,
        "verify": {"ok": verify.get("ok"), "events": verify.get("events"),
                   "differences": len(verify.get("differences", [])), "error": verify.get("error")},
        "verify_chain": {"ok": chain.get("ok"), "events": chain.get("events"), "streams": chain.get("streams"),
                         "problems": len(chain.get("problems", [])), "error": chain.get("error")},
        "seconds": {"fault_window": round(fault_window, 1),
                    "drain": None if drain_seconds == float("inf") else round(drain_seconds, 1),
                    "total": round(total, 1)},
        "worker_exit_codes": exits, "gateway_starts": run.gateway.starts, "cluster_events": cluster.events,
        "workdir": str(workdir),
    }


def report(r: dict[str, Any]) -> None:
    print(f"failover workers={r['workers']} tasks={r['tasks']} lease_seconds={r['lease_seconds']} "
          f"failovers={r['failovers']} fault_window_s={r['seconds']['fault_window']} "
          f"drain_s={r['seconds']['drain']} total_s={r['seconds']['total']}")
    print("| # | fault | primary | writable after | a task completes after | cluster whole after |")
    print("|---|---|---|---|---|---|")
    for x in r["recoveries"]:
        resumed = "—" if x["completions_resume_s"] is None else f"{x['completions_resume_s']} s"
        print(f"| {x['number']} | {x['kind']} | {x['old_leader']} → {x['new_leader']} | {x['writable_s']} s "
              f"| {resumed} | {x['whole_s']} s |")
    if r["storm"]:
        print("terminate_storm " + " ".join(f"{k}={v}" for k, v in r["storm"].items()))
    if r["exhaustion"]:
        print("connection_exhaustion " + " ".join(f"{k}={v}" for k, v in r["exhaustion"].items()))
    c = r["counts"]
    print(f"check lost={c['lost']} completed_twice={c['completed_twice']} stale_accepted={c['stale_accepted']} "
          f"ingested_twice={c['ingested_twice']} stuck={c['stuck']} attempt_ran_twice={c['attempt_ran_twice']} "
          f"created_twice={c['created_twice']} completed_without_execution={c['completed_without_execution']}")
    v, ch = r["verify"], r["verify_chain"]
    print(f"replay verify={'OK' if v['ok'] else 'FAILED'} events={v['events']} differences={v['differences']}"
          f"{' error=' + str(v['error']) if v['error'] else ''}; verify-chain={'OK' if ch['ok'] else 'FAILED'} "
          f"streams={ch['streams']} problems={ch['problems']}{' error=' + str(ch['error']) if ch['error'] else ''}")
    e = r["effects"]
    print(f"effects completed={r['completed']} attempts={e.get('attempts', 0)} retried_tasks={e.get('retried_tasks', 0)} "
          f"lease_expired={e.get('event_LeaseExpired', 0)} attempt_failed={e.get('event_AttemptFailed', 0)} "
          f"lease_reissued={e.get('event_LeaseReissued', 0)} write_rejected={e.get('event_WriteRejected', 0)}")
    print("gateway_5xx " + (" ".join(f"{k}={v}" for k, v in sorted(r["gateway_5xx"].items())) or "none"))
    print("notes " + (" ".join(f"{k}={v}" for k, v in r["notes"].items()) or "none")
          + f" gateway_starts={r['gateway_starts']}")
    for name, ids in r["examples"].items():
        print(f"example {name}: {' '.join(ids)}")
    print("result " + ("PASS" if r["ok"] else "FAIL"))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--failovers", type=int, default=5, help="primary changes to cause")
    p.add_argument("--kinds", default=",".join(KINDS), help="fault kinds, taken in turn (comma-separated)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--tasks", type=int, default=600)
    p.add_argument("--feed-seconds", type=float, default=150.0, help="the feeder spreads the tasks over this")
    p.add_argument("--warmup-seconds", type=float, default=5.0, help="load before the first fault")
    p.add_argument("--pause-seconds", type=float, default=3.0, help="load between two faults")
    p.add_argument("--storm-seconds", type=float, default=0.0,
                   help="after the failovers, terminate every backend of the database every 0.3 s for this long")
    p.add_argument("--exhaust-seconds", type=float, default=0.0,
                   help="then hold every free connection slot of the primary for this long")
    p.add_argument("--lease-seconds", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--max-attempts", type=int, default=10)
    p.add_argument("--request-timeout-seconds", type=float, default=40.0,
                   help="the workers' HTTP request limit (a command may wait out a failover)")
    p.add_argument("--work-seconds", default="0.3,2.0")
    p.add_argument("--long-share", type=float, default=0.0)
    p.add_argument("--long-seconds", type=float, default=None)
    p.add_argument("--gateway-processes", type=int, default=1)
    p.add_argument("--drain-seconds", type=float, default=300.0)
    p.add_argument("--progress-seconds", type=float, default=20.0)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(args.kinds) - set(KINDS)
    if unknown:
        p.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    args.seed = 0
    return args


def main(argv: list[str] | None = None) -> int:
    settings = parse(argv)
    reason = patroni_available()
    if reason is not None:
        print(f"failover: cannot run: {reason}", file=sys.stderr)
        return 2
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    workdir = settings.workdir or Path(tempfile.mkdtemp(prefix="leasehold-failover-"))
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o755)
    with patroni_cluster() as cluster:
        result = asyncio.run(soak(settings, workdir, cluster))
    if settings.json:
        print(json.dumps(result))
    else:
        report(result)
    if result["ok"] and not settings.keep and settings.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
