"""Failover soak: workers and operators under load while the database fails: the primary, etcd, connections, cleanup.

Everything is real and local: a Patroni cluster of this run's own (``tests/support/patroni.py``:
etcd with ``--etcd-members`` members (3 by default), two PostgreSQL 15 nodes,
``synchronous_mode: true``, ``synchronous_commit = on``), a ``leasehold gateway serve`` process
whose ``--database-url`` is the cluster's multi-host URL (``target_session_attrs=read-write``), K
``leasehold worker run`` processes running the chaos plugin (``bench/chaos_plugin.py``, which
records every execution), a feeder creating M tasks over ``--feed-seconds`` as the operator does
(a scan each), and the operator's reads all along (list tasks, show one, list scans, every
0.25 s, with an organisation's API key; each answer counted per fault) — the machinery of
``bench/chaos.py``, with failovers as its faults:

======================  =======================================================================
node_kill               SIGKILL the leader's patroni and postgres (the machine dies): its leader
                        key expires (ttl) and Patroni promotes the synchronous standby; the dead
                        node is started again and rejoins as the new standby (``pg_rewind``)
switchover              ``patronictl switchover`` to the synchronous standby (planned)
postgres_kill_failover  SIGKILL the leader's postmaster, then ``patronictl failover`` to the
                        standby (retried while Patroni is still restarting the killed server)
======================  =======================================================================

One at a time, in that order, round after round, until ``--failovers`` primary changes have
happened; after each, the cluster must be whole again (a leader and its synchronous standby)
before the next. Then, each optional:

* ``--etcd-member-loss-seconds``: SIGKILL etcd's raft leader (one member of three) and start it
  again after that long: a leader elected among the other two, the primary kept (same node,
  same timeline: a failure otherwise), tasks completing meanwhile, the member rejoining;
* ``--quorum-loss-seconds``: SIGKILL two members of three for that long: Patroni demotes its
  primary (no server accepts writes; the Gateway answers 503, never another 5xx), then quorum,
  a writable leader and the whole cluster again after their restart;
* ``--storm-seconds``: every backend of the run's database (the Gateway's pool, its LISTEN
  connection, the plugins' writes) terminated every 0.3 s for that long;
* ``--exhaust-seconds``: the run database's backends terminated, then every free slot of the
  primary's ``max_connections`` taken and held for that long;
* ``--idle-in-tx-seconds`` and ``--long-reader-seconds``: a session on the primary idle in a
  transaction that wrote, then one holding a ``REPEATABLE READ`` snapshot, for that long each,
  with ``--window-seconds`` measured before and after: per window the hot tables' dead row
  versions, the age of the oldest transaction or snapshot, tasks completed, and the acquire
  latency of a probe (create -> acquire -> complete in this process, on tasks of its own type,
  which the checker leaves out).

Per fault it measures: seconds until the multi-host URL reaches a writable server, until the
first task completes after the fault (the whole path: Gateway, workers, database), and until the
cluster is whole again. Then it drains, and checks per task (``bench/chaos.py``'s checker: lost,
completed twice, a write from a fenced attempt accepted, ingested twice, stuck, an attempt run
twice), ``leasehold replay verify`` (a rebuild equals the live projections) and ``verify-chain``
(the hash chain unbroken); it exits 0 only when all hold, every operator read was answered 200
or 503, and the Gateway answered no 5xx but 503.

Usage::

    .venv/bin/python bench/failover.py                    # 5 failovers, 4 workers, 600 tasks
    .venv/bin/python bench/failover.py --failovers 2 --tasks 120 --workers 2
    .venv/bin/python bench/failover.py --failovers 6 --tasks 1200 --feed-seconds 600 \
        --etcd-member-loss-seconds 15 --quorum-loss-seconds 45 --storm-seconds 10 --exhaust-seconds 15 \
        --idle-in-tx-seconds 120 --long-reader-seconds 120 --window-seconds 20    # every fault, ~11 min
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import ssl
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import chaos
import psycopg
from core_lifecycle import BenchLoop, make_loop, one_lifecycle

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.patroni import (  # noqa: E402
    EtcdMember,
    PatroniCluster,
    patroni_available,
    patroni_cluster,
    wait_writable,
)
from support.waits import wait_until_sync  # noqa: E402

KINDS = ("node_kill", "switchover", "postgres_kill_failover")
#: The hot tables whose dead row versions a held session lets pile up.
HOT_TABLES = ("worker_tasks", "worker_task_attempts", "scan_jobs")
#: The operator's reads that run all along (the feeder is the operator's writes).
OPERATOR_READS = ("list tasks", "show task", "list scans")


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


@dataclass
class Phase:
    """What the soak is doing now (the operator's reads are counted per phase)."""

    name: str = "warmup"


class _ClusterServer:
    """What ``chaos.provision`` asks of a server: its maintenance URL."""

    def __init__(self, cluster: PatroniCluster) -> None:
        self.cluster = cluster

    def url(self) -> str:
        return self.cluster.url("postgres")


async def _succeeded(run: chaos.Run) -> int:
    """Attempts of the soak's tasks that succeeded (the acquire probe's own tasks left out)."""
    rows = await chaos.patiently("count", lambda: run.rows(
        "SELECT count(*) FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id "
        "WHERE a.status = 'succeeded' AND t.task_type = %s", chaos.TASK_TYPE))
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


async def inject(run: chaos.Run, cluster: PatroniCluster, kind: str, number: int, phase: Phase) -> Recovery:
    leader = await asyncio.to_thread(cluster.wait_healthy)
    phase.name = f"{number} {kind}"
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


async def faults(run: chaos.Run, cluster: PatroniCluster, settings: argparse.Namespace,
                 phase: Phase) -> list[Recovery]:
    recoveries: list[Recovery] = []
    number = 0
    while sum(1 for r in recoveries if r.old_leader != r.new_leader) < settings.failovers:
        kind = settings.kinds[number % len(settings.kinds)]
        number += 1
        recoveries.append(await inject(run, cluster, kind, number, phase))
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


# --- etcd ---------------------------------------------------------------------------------------


def _timeline(cluster: PatroniCluster) -> tuple[str, object] | None:
    """(the leader's name, its timeline), or None without a running leader."""
    for member in cluster.members():
        if member.get("role") == "leader" and member.get("state") == "running":
            return str(member["name"]), member.get("timeline")
    return None


async def _wait(predicate: Any, within: float, what: str) -> Any:
    return await asyncio.to_thread(wait_until_sync, predicate, within, what=what, interval=0.1)


async def etcd_member_loss(run: chaos.Run, cluster: PatroniCluster, down_seconds: float) -> dict[str, Any]:
    """SIGKILL etcd's raft leader (one member of three): the other two elect a leader among them
    and keep quorum, Patroni keeps its leader key through them, writes go on. After
    ``down_seconds`` (longer than Patroni's ttl, so its key is renewed through the survivors) the
    member is started again and rejoins."""
    await asyncio.to_thread(cluster.wait_etcd_whole)
    await asyncio.to_thread(cluster.wait_healthy)
    primary = _timeline(cluster)
    victim: EtcdMember = await _wait(cluster.etcd_leader, 30, "an etcd leader")
    before = await _succeeded(run)
    started = time.monotonic()
    cluster.kill_etcd(victim)

    def new_leader() -> EtcdMember | None:
        found = cluster.etcd_leader()
        return found if found is not None and found is not victim else None

    await _wait(new_leader, 60, "the two live etcd members to elect a leader")
    elected_s = time.monotonic() - started
    resumed = await _completion_after(run, before, 60.0)
    resumed_s = None if resumed is None else time.monotonic() - started
    await asyncio.sleep(max(0.0, started + down_seconds - time.monotonic()))
    completed_while_down = await _succeeded(run) - before
    restarted = time.monotonic()
    cluster.start_etcd(victim)
    await asyncio.to_thread(cluster.wait_etcd_whole, 60.0)
    rejoined_s = time.monotonic() - restarted
    await asyncio.to_thread(cluster.wait_healthy, 60.0)
    after = _timeline(cluster)
    result = {"member": victim.name, "was_etcd_leader": True, "down_s": round(restarted - started, 1),
              "etcd_leader_elected_s": round(elected_s, 1),
              "completion_after_s": None if resumed_s is None else round(resumed_s, 1),
              "completed_while_down": completed_while_down, "rejoined_after_restart_s": round(rejoined_s, 1),
              "primary_before": primary, "primary_after": after, "primary_kept": primary == after}
    chaos.log(f"etcd member loss: {result}")
    return result


async def etcd_quorum_loss(run: chaos.Run, cluster: PatroniCluster, down_seconds: float) -> dict[str, Any]:
    """SIGKILL two of the three etcd members (the raft leader among them): no quorum, so Patroni
    cannot renew its leader key and demotes its primary; no server accepts writes and the
    Gateway answers 503 (never 500). After ``down_seconds`` both are started again: quorum back,
    a leader elected, writes resume."""
    await asyncio.to_thread(cluster.wait_etcd_whole)
    await asyncio.to_thread(cluster.wait_healthy)
    primary = _timeline(cluster)
    leader: EtcdMember = await _wait(cluster.etcd_leader, 30, "an etcd leader")
    victims = [leader, next(m for m in cluster.etcd if m is not leader)]
    url = cluster.url(chaos.DATABASE)
    started = time.monotonic()
    for member in victims:
        cluster.kill_etcd(member)

    def read_only() -> bool:
        return not any(_writable_now(node.url(chaos.DATABASE)) for node in cluster.nodes)

    try:
        await _wait(read_only, max(down_seconds, 30.0), "Patroni to demote its primary")
        demoted_s: float | None = time.monotonic() - started
    except AssertionError:
        demoted_s = None
    await asyncio.sleep(max(0.0, started + down_seconds - time.monotonic()))
    restarted = time.monotonic()
    for member in victims:
        cluster.start_etcd(member)
    await asyncio.to_thread(cluster.wait_etcd_whole, 60.0)
    quorum_s = time.monotonic() - restarted
    await asyncio.to_thread(wait_writable, url, 120.0)
    writable_s = time.monotonic() - restarted
    before = await _succeeded(run)
    resumed = await _completion_after(run, before, 120.0)
    resumed_s = None if resumed is None else time.monotonic() - restarted
    await asyncio.to_thread(cluster.wait_healthy, 180.0)
    whole_s = time.monotonic() - restarted
    result = {"members": [m.name for m in victims], "down_s": round(restarted - started, 1),
              "demoted_after_s": None if demoted_s is None else round(demoted_s, 1),
              "quorum_after_restart_s": round(quorum_s, 1), "writable_after_restart_s": round(writable_s, 1),
              "completion_after_restart_s": None if resumed_s is None else round(resumed_s, 1),
              "whole_after_restart_s": round(whole_s, 1), "primary_before": primary,
              "primary_after": _timeline(cluster)}
    chaos.log(f"etcd quorum loss: {result}")
    return result


def _writable_now(url: str) -> bool:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
            return row is not None and row[0] is False
    except psycopg.Error:
        return False


# --- sessions that hold back cleanup ------------------------------------------------------------


class Probe:
    """Times acquire in-process on the run's own pool: one loop of create_task -> acquire ->
    complete on tasks of its own type (``probe``: not the chaos tasks, left out of the checker)."""

    def __init__(self, run: chaos.Run, loop: BenchLoop) -> None:
        self.run, self.loop = run, loop
        self.steps: dict[str, list[float]] = {"create_task": [], "acquire": [], "submit_batch": [], "complete": []}
        self.errors = 0
        self.task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        while True:
            try:
                await one_lifecycle(self.run.services.lifecycle, self.run.services.scans, self.loop, self.steps)
            except Exception:  # a fault elsewhere; counted, and the probe goes on
                self.errors += 1
                await asyncio.sleep(0.5)
            await asyncio.sleep(0.05)

    def start(self) -> None:
        if self.task is None:
            self.task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None

    def mark(self) -> int:
        return len(self.steps["acquire"])

    def acquire_ms(self, since: int) -> dict[str, Any]:
        values = sorted(x * 1e3 for x in self.steps["acquire"][since:])
        if not values:
            return {"n": 0, "p50_ms": None, "p99_ms": None}
        return {"n": len(values), "p50_ms": round(values[len(values) // 2], 1),
                "p99_ms": round(values[min(len(values) - 1, int(len(values) * 0.99))], 1)}


async def _cleanup_state(url: str) -> dict[str, Any]:
    """The hot tables' dead row versions, and the age (in transactions) of the oldest transaction
    or snapshot of the database's sessions: vacuum and pruning may not remove what is younger."""
    await asyncio.sleep(1.0)  # backends flush their statistics at most once a second
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT relname, n_dead_tup FROM pg_stat_user_tables WHERE relname = ANY(%s)",
                                 (list(HOT_TABLES),))
        dead = {str(name): int(n) for name, n in await cur.fetchall()}
        # An idle transaction that wrote holds its xid (backend_xid), a reader its snapshot (backend_xmin).
        cur = await conn.execute("SELECT max(greatest(age(backend_xid), age(backend_xmin))) FROM pg_stat_activity "
                                 "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        row = await cur.fetchone()
    return {"dead_tuples": dead, "oldest_xmin_age": None if row is None or row[0] is None else int(row[0])}


async def held_session(run: chaos.Run, cluster: PatroniCluster, probe: Probe, kind: str, seconds: float,
                       window: float) -> dict[str, Any]:
    """A session on the primary that holds back cleanup for ``seconds`` under load: ``idle_in_tx``
    (``BEGIN; SELECT txid_current()``, then idle) or ``long_reader`` (a ``REPEATABLE READ``
    snapshot, as a long report holds). Per window (``window`` seconds before, the hold, ``window``
    seconds after): the hot tables' dead row versions at its end, the probe's acquire latency,
    tasks completed."""
    leader = await asyncio.to_thread(cluster.wait_healthy)
    url = leader.url(chaos.DATABASE)
    probe.start()
    windows: dict[str, Any] = {}

    async def measure(name: str, length: float, holding: asyncio.Future[None] | None = None) -> None:
        mark, done = probe.mark(), await _succeeded(run)
        started = time.monotonic()
        await asyncio.sleep(length)
        windows[name] = {"seconds": round(time.monotonic() - started, 1), "acquire": probe.acquire_ms(mark),
                         "completed": await _succeeded(run) - done}
        windows[name].update(await _cleanup_state(url))

    await measure("before", window)
    async with await psycopg.AsyncConnection.connect(url) as holder:
        if kind == "idle_in_tx":
            await holder.execute("SELECT txid_current()")
        else:
            await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            await holder.execute("SELECT count(*) FROM events")
        await measure("during", seconds)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as look:
            state = await (await look.execute("SELECT state FROM pg_stat_activity WHERE pid = %s",
                                              (holder.info.backend_pid,))).fetchone()
        await holder.rollback()
    await measure("after", window)
    result = {"kind": kind, "seconds": seconds, "held_state": None if state is None else state[0],
              "windows": windows, "probe_errors": probe.errors}
    chaos.log(f"{kind}: {result}")
    return result


# --- the operator's reads -----------------------------------------------------------------------


async def operator_reads(run: chaos.Run, key: str, phase: Phase, answers: dict[str, Counter[str]]) -> None:
    """The operator reads all along: list tasks, show one of them, list scans, every 0.25 s.
    ``answers[phase][status]``: status is the HTTP status, or ``no answer``; and
    ``answers[phase]["slowest_ms"]``, the slowest answer's wait."""
    ctx = ssl.create_default_context(cafile=str(run.gateway.pki_dir / "ca.pem"))
    base = f"https://localhost:{run.gateway.operator_port}"
    shown: str | None = None
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx),
                                     headers={"Authorization": f"Bearer {key}"},
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        while True:
            for what in OPERATOR_READS:
                if what == "show task" and shown is None:
                    continue
                path = {"list tasks": "/v1/tasks?limit=20", "show task": f"/v1/tasks/{shown}",
                        "list scans": "/v1/scans?limit=5"}[what]
                sent = time.monotonic()
                try:
                    async with session.get(base + path) as r:
                        status = str(r.status)
                        if r.status == 200 and what == "list tasks":
                            items = (await r.json()).get("items") or []
                            if items:
                                shown = str(items[-1]["id"])
                except (aiohttp.ClientError, OSError, TimeoutError):
                    status = "no answer"
                counts = answers.setdefault(phase.name, Counter())
                counts[status] += 1
                counts["slowest_ms"] = max(counts["slowest_ms"], round((time.monotonic() - sent) * 1e3))
            await asyncio.sleep(0.25)


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
    operator_key = (await run.services.registry.create_api_key(organization_id=run.org, name="soak-operator")).key
    probe = Probe(run, await make_loop(run.services.registry, "failover-probe"))
    started = time.monotonic()
    helpers: list[asyncio.Task[None]] = []
    fivexx: dict[str, int] = {}
    phase = Phase()
    reads: dict[str, Counter[str]] = {}
    extra: dict[str, Any] = {}
    try:
        await chaos.start_gateway(run)
        for worker in run.workers:
            await worker.start()
        chaos.log(f"{settings.workers} workers, {settings.tasks} tasks, {settings.failovers} failovers "
                  f"(lease {settings.lease_seconds}s); logs in {workdir}")
        helpers = [asyncio.create_task(chaos.watch(run)), asyncio.create_task(chaos.progress(run, started)),
                   asyncio.create_task(operator_reads(run, operator_key, phase, reads))]
        feeder = asyncio.create_task(chaos.feed(run, settings.feed_seconds))
        await asyncio.sleep(settings.warmup_seconds)
        recoveries = await faults(run, cluster, settings, phase)
        if settings.etcd_member_loss_seconds > 0:
            phase.name = "etcd_member_loss"
            extra["etcd_member_loss"] = await etcd_member_loss(run, cluster, settings.etcd_member_loss_seconds)
            await asyncio.sleep(settings.pause_seconds)
        if settings.quorum_loss_seconds > 0:
            phase.name = "etcd_quorum_loss"
            extra["etcd_quorum_loss"] = await etcd_quorum_loss(run, cluster, settings.quorum_loss_seconds)
            await asyncio.sleep(settings.pause_seconds)
        if settings.storm_seconds > 0:
            phase.name = "terminate_storm"
            extra["storm"] = await storm(run, cluster, settings.storm_seconds)
        if settings.exhaust_seconds > 0:
            phase.name = "connection_exhaustion"
            extra["exhaustion"] = await exhaust(run, cluster, settings.exhaust_seconds)
        for kind, seconds in (("idle_in_tx", settings.idle_in_tx_seconds),
                              ("long_reader", settings.long_reader_seconds)):
            if seconds > 0:
                phase.name = kind
                extra[kind] = await held_session(run, cluster, probe, kind, seconds, settings.window_seconds)
        await probe.stop()
        fault_window = time.monotonic() - started
        phase.name = "drain"
        fed_throughout = not feeder.done()  # tasks still being created when the last fault ended
        await feeder
        chaos.log(f"faults over after {fault_window:.0f}s; draining")
        drain_seconds = await chaos.drain(run, settings.drain_seconds, chaos.TASK_TYPE)
        fivexx = await http_5xx(run)
        for helper in helpers:
            helper.cancel()
        exits = [await w.stop(30) for w in run.workers]
        await run.gateway.stop()
        total = time.monotonic() - started
        async with await psycopg.AsyncConnection.connect(run.database_url) as conn:
            result = await chaos.check(conn, settings.tasks, task_type=chaos.TASK_TYPE)
        verify, chain = chaos.replay("verify", run.database_url), chaos.replay("verify-chain", run.database_url)
    finally:
        await probe.stop()
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
    operator = {name: dict(sorted(counts.items())) for name, counts in reads.items()}
    bad_reads = sum(n for counts in operator.values() for status, n in counts.items()
                    if status not in ("200", "503", "slowest_ms"))
    other_5xx = sum(n for key, n in fivexx.items() if not key.startswith("503 "))
    member_loss = extra.get("etcd_member_loss")
    ok = (all(v == 0 for v in result["counts"].values()) and verify.get("ok") is True and chain.get("ok") is True
          and drain_seconds != float("inf") and result["tasks"] >= settings.tasks
          and failovers >= settings.failovers and bad_reads == 0 and other_5xx == 0
          and (member_loss is None or member_loss["primary_kept"] is True))
    return {
        "ok": ok, "workers": settings.workers, "tasks": settings.tasks, "lease_seconds": settings.lease_seconds,
        "etcd_members": settings.etcd_members,
        "failovers": failovers, "recoveries": [asdict(r) for r in recoveries], "counts": result["counts"],
        "examples": result["examples"], "completed": result["completed"], "effects": result["effects"],
        "notes": dict(sorted(run.notes.items())), "gateway_5xx": fivexx, "gateway_5xx_not_503": other_5xx,
        "operator_reads": operator, "operator_reads_not_200_or_503": bad_reads,
        "etcd_member_loss": member_loss, "etcd_quorum_loss": extra.get("etcd_quorum_loss"),
        "storm": extra.get("storm"), "exhaustion": extra.get("exhaustion"),
        "idle_in_tx": extra.get("idle_in_tx"), "long_reader": extra.get("long_reader"),
        "verify": {"ok": verify.get("ok"), "events": verify.get("events"),
                   "differences": len(verify.get("differences", [])), "error": verify.get("error")},
        "verify_chain": {"ok": chain.get("ok"), "events": chain.get("events"), "streams": chain.get("streams"),
                         "problems": len(chain.get("problems", [])), "error": chain.get("error")},
        "fed_throughout": fed_throughout,
        "seconds": {"fault_window": round(fault_window, 1),
                    "drain": None if drain_seconds == float("inf") else round(drain_seconds, 1),
                    "total": round(total, 1)},
        "worker_exit_codes": exits, "gateway_starts": run.gateway.starts, "cluster_events": cluster.events,
        "workdir": str(workdir),
    }


def _reads(r: dict[str, Any], phase: str) -> str:
    counts = r["operator_reads"].get(phase, {})
    other = sum(n for status, n in counts.items() if status not in ("200", "503", "slowest_ms"))
    return (f"{counts.get('200', 0)} / {counts.get('503', 0)} / {other} "
            f"(slowest {counts.get('slowest_ms', 0) / 1e3:.1f} s)")


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value} s"


def report(r: dict[str, Any]) -> None:
    print(f"failover workers={r['workers']} tasks={r['tasks']} lease_seconds={r['lease_seconds']} "
          f"etcd_members={r['etcd_members']} failovers={r['failovers']} fault_window_s={r['seconds']['fault_window']} "
          f"drain_s={r['seconds']['drain']} total_s={r['seconds']['total']} fed_throughout={r['fed_throughout']}")
    print("| # | fault | primary | writable after | a task completes after | cluster whole after "
          "| operator reads 200 / 503 / other |")  # other: neither 200 nor 503 (a failure)
    print("|---|---|---|---|---|---|---|")
    for x in r["recoveries"]:
        print(f"| {x['number']} | {x['kind']} | {x['old_leader']} → {x['new_leader']} | {x['writable_s']} s "
              f"| {_s(x['completions_resume_s'])} | {x['whole_s']} s | {_reads(r, str(x['number']) + ' ' + x['kind'])} |")
    n = len(r["recoveries"])
    m = r["etcd_member_loss"]
    if m:
        n += 1
        kept = "kept" if m["primary_kept"] else f"{m['primary_before']} → {m['primary_after']}"
        print(f"| {n} | etcd_member_loss ({m['member']}, the etcd leader, down {m['down_s']} s) | {kept} "
              f"| writable throughout (etcd leader again after {m['etcd_leader_elected_s']} s) "
              f"| {_s(m['completion_after_s'])} | member rejoined {m['rejoined_after_restart_s']} s after its restart "
              f"| {_reads(r, 'etcd_member_loss')} |")
    q = r["etcd_quorum_loss"]
    if q:
        n += 1
        print(f"| {n} | etcd_quorum_loss (2 of 3 down {q['down_s']} s; primary demoted after "
              f"{_s(q['demoted_after_s'])}) | {q['primary_before'] and q['primary_before'][0]} → "
              f"{q['primary_after'] and q['primary_after'][0]} | {q['writable_after_restart_s']} s after the restart "
              f"| {_s(q['completion_after_restart_s'])} after the restart | {q['whole_after_restart_s']} s after the restart "
              f"| {_reads(r, 'etcd_quorum_loss')} |")
    st = r["storm"]
    if st:
        n += 1
        print(f"| {n} | terminate_storm ({st['terminated']} backends, {st['rounds']} rounds, {st['seconds']} s) "
              f"| kept | — | {_s(st['completion_after_end_s'])} after its end ({st['completed_during']} during it) "
              f"| — | {_reads(r, 'terminate_storm')} |")
    ex = r["exhaustion"]
    if ex:
        n += 1
        print(f"| {n} | connection_exhaustion ({ex['slots_held']} slots held {ex['seconds']} s) | kept | — "
              f"| {_s(ex['completion_after_release_s'])} after the release ({ex['completed_during']} during it) "
              f"| — | {_reads(r, 'connection_exhaustion')} |")
    for kind in ("idle_in_tx", "long_reader"):
        h = r[kind]
        if h:
            n += 1
            print(f"| {n} | {kind} ({h['seconds']:g} s, session {h['held_state']}) | kept | — "
                  f"| {h['windows']['during']['completed']} completed during it | — | {_reads(r, kind)} |")
    held = [r[k] for k in ("idle_in_tx", "long_reader") if r[k]]
    if held:
        print()
        print("| session | window | seconds | tasks completed | probe acquire p50 / p99 | horizon age (xids) | "
              + " | ".join(f"dead {t}" for t in HOT_TABLES) + " |")
        print("|---|---|---|---|---|---|" + "---|" * len(HOT_TABLES))
        for h in held:
            for name, w in h["windows"].items():
                a = w["acquire"]
                print(f"| {h['kind']} | {name} | {w['seconds']} | {w['completed']} | {a['p50_ms']} / {a['p99_ms']} ms "
                      f"(n={a['n']}) | {w['oldest_xmin_age']} | " + " | ".join(str(w["dead_tuples"].get(t, "?")) for t in HOT_TABLES) + " |")
        print()
    for name in ("etcd_member_loss", "etcd_quorum_loss", "storm", "exhaustion"):
        if r[name]:
            print(f"{name} " + " ".join(f"{k}={v}" for k, v in r[name].items()))
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
    print("gateway_5xx " + (" ".join(f"{k}={v}" for k, v in sorted(r["gateway_5xx"].items())) or "none")
          + f" (not 503: {r['gateway_5xx_not_503']})")
    print("operator_reads " + " ".join(f"[{phase}] " + ",".join(f"{k}:{v}" for k, v in counts.items())
                                       for phase, counts in r["operator_reads"].items())
          + f" (not 200 or 503: {r['operator_reads_not_200_or_503']})")
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
    p.add_argument("--etcd-members", type=int, choices=(1, 3), default=3,
                   help="etcd members of the cluster (the etcd faults need 3)")
    p.add_argument("--etcd-member-loss-seconds", type=float, default=0.0,
                   help="after the failovers, SIGKILL etcd's leader member and start it again after this long")
    p.add_argument("--quorum-loss-seconds", type=float, default=0.0,
                   help="then SIGKILL two of the three etcd members and start them again after this long")
    p.add_argument("--idle-in-tx-seconds", type=float, default=0.0,
                   help="then a session idle in a transaction on the primary for this long")
    p.add_argument("--long-reader-seconds", type=float, default=0.0,
                   help="then a REPEATABLE READ transaction holding its snapshot for this long")
    p.add_argument("--window-seconds", type=float, default=10.0,
                   help="the windows measured before and after each held session")
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
    if args.etcd_members < 3 and (args.etcd_member_loss_seconds > 0 or args.quorum_loss_seconds > 0):
        p.error("the etcd faults need --etcd-members 3")
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
    with patroni_cluster(etcd_members=settings.etcd_members) as cluster:
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
