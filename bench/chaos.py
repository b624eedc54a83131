"""Chaos soak: K worker processes run M tasks while faults rain down, then a per-task checker.

Everything is real and local: an embedded PostgreSQL this run owns (so it may crash it), a
``leasehold gateway serve`` process, K ``leasehold worker run`` processes, each reaching the
Gateway through its own fault proxy (``tests/support/faultproxy.py``), and the scanner plugin
``bench/chaos_plugin.py``, which records every execution in the side table
``chaos_executions`` (keyed by attempt; created here, in the scratch database, not by a
migration). A feeder creates the M tasks (one single-step profile scan each) spread over the
fault window, while the fault schedule runs:

==================  ===========================================================================
worker_kill         SIGKILL a worker (its plugins die with it), start it again 0.5-2 s later
worker_stop         SIGSTOP a worker past its lease (lease + sweep + 1-3 s), then SIGCONT: its
                    late writes must be refused
gateway_restart     SIGKILL the Gateway, start it again 0.3-1.5 s later on the same ports
pg_restart          ``pg_ctl restart -m immediate``: crash and recovery of PostgreSQL
blackhole           one worker's proxy drops everything for lease + 1-3 s
partition           one worker's proxy holds everything for lease + 1-3 s, then delivers it late
drop_response       one worker's next 1-3 requests are processed but their answers dropped
stale_write         once, at the start: a worker of the soak's own (``chaos-stale``) takes the
                    first task, stalls until the Gateway has expired its lease, then renews it:
                    the late write must be refused (409); the task is then retried by the others
==================  ===========================================================================

The schedule deals the kinds in rounds (shuffled, weighted); the first round is always dealt in
full, however short the fault window, so every kind is injected at least once. ``stale_write``
does not depend on timing either: a refused late write and an expired lease happen in every run,
whatever the other faults happened to hit.

Then it heals everything, drains (waits until every task is terminal, up to
``--drain-seconds``), stops the processes, and checks per task id (see ``bench/README.md``):
lost, completed twice, a result accepted from a superseded attempt, a batch ingested twice,
stuck in a non-terminal state; then ``leasehold replay verify`` and ``verify-chain``. It prints
the counts and the fault tally (``--json``: one JSON object on stdout) and exits 0 only when
every count is 0 and both verifications are clean.

Usage::

    .venv/bin/python bench/chaos.py                  # K=8 workers, M=5000 tasks, 600 s of faults
    .venv/bin/python bench/chaos.py --workers 3 --tasks 150 --fault-seconds 40 --lease-seconds 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import aiohttp
import psycopg
from common import recreate_database
from psycopg_pool import AsyncConnectionPool

from leasehold.cli.dev_ca import init_pki, issue_worker_certificate
from leasehold.cli.embedded import EmbeddedPostgres, _bin_dir
from leasehold.domain.errors import Unavailable
from leasehold.domain.events import ProfileStep
from leasehold.gateway.services import Services, build_services
from leasehold.migrations import runner as migrate
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database
from leasehold.worker.client import AttemptRef, GatewayClient, LeaseLost
from leasehold.worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's fault proxy is the one to use
from support.faultproxy import Fault, FaultProxy  # noqa: E402

DATABASE = "leasehold_chaos"
TASK_TYPE = "chaos"
KINDS = ("worker_kill", "worker_stop", "gateway_restart", "pg_restart", "blackhole", "partition", "drop_response",
         "stale_write")
#: How often each kind comes up in one round of the schedule (every kind at least once a round);
#: ``stale_write`` is not dealt: it runs once, at the start (:func:`stale_write`).
WEIGHTS = {"worker_kill": 2, "worker_stop": 2, "gateway_restart": 1, "pg_restart": 1, "blackhole": 2,
           "partition": 2, "drop_response": 3, "stale_write": 0}
STALE_WORKER = "chaos-stale"
SIDE_TABLE = """
CREATE TABLE chaos_executions (
    attempt_id      uuid NOT NULL,
    run_id          uuid NOT NULL,
    task_id         uuid NOT NULL,
    attempt_number  integer NOT NULL,
    worker          text NOT NULL,
    pid             integer NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at     timestamptz,
    PRIMARY KEY (attempt_id, run_id)
)
"""
NON_TERMINAL = ("pending", "leased", "running", "retry_wait", "cancelling")


def log(message: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- processes ----------------------------------------------------------------------------------


class GatewayProcess:
    """``leasehold gateway serve`` in its own session (a kill takes all its processes)."""

    def __init__(self, database_url: str, pki_dir: Path, log_path: Path, settings: argparse.Namespace) -> None:
        self.database_url, self.pki_dir, self.log_path = database_url, pki_dir, log_path
        self.worker_port, self.operator_port = free_port(), free_port()
        self.settings = settings
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self) -> None:
        leasehold = Path(sys.executable).with_name("leasehold")
        with self.log_path.open("ab") as out:
            self.process = await asyncio.create_subprocess_exec(
                str(leasehold), "gateway", "serve", "--database-url", self.database_url,
                "--pki-dir", str(self.pki_dir), "--worker-port", str(self.worker_port),
                "--operator-port", str(self.operator_port), "--processes", str(self.settings.gateway_processes),
                "--sweep-interval-seconds", "0.5", "--poll-interval-seconds", "1",
                "--checkpoint-interval-seconds", "10", "--pool-size", "10", "--log-level", "WARNING",
                "--rate-limit-per-second", "100000", "--rate-limit-burst", "100000",
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        self.starts += 1
        await self.ready()

    async def ready(self, within: float = 90.0) -> None:
        ctx = ssl.create_default_context(cafile=str(self.pki_dir / "ca.pem"))
        deadline = time.monotonic() + within
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, force_close=True)) as session:
            while True:
                if self.process is None or self.process.returncode is not None:
                    raise RuntimeError(f"the Gateway exited while starting; see {self.log_path}")
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    async with session.get(f"https://localhost:{self.operator_port}/readyz",
                                           timeout=aiohttp.ClientTimeout(total=5)) as r:
                        if r.status == 200:
                            return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Gateway was not ready within {within:g}s; see {self.log_path}")
                await asyncio.sleep(0.2)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def kill(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            await self.process.wait()

    async def stop(self) -> int | None:
        if not self.alive:
            return None
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            await self.kill()
            return None


@dataclass
class WorkerProcess:
    """One ``leasehold worker run`` process; started again after a kill, with the same certificate."""

    index: int
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    stopped: bool = False  # SIGSTOPped by the schedule
    expected_exit: bool = False
    unexpected_exits: list[int] = field(default_factory=list)

    async def start(self) -> None:
        leasehold = Path(sys.executable).with_name("leasehold")
        with self.log_path.open("ab") as out:
            self.process = await asyncio.create_subprocess_exec(
                str(leasehold), "worker", "run", *self.argv, env=self.env,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out)
        self.expected_exit = False

    async def kill(self) -> None:
        assert self.process is not None
        self.expected_exit = True
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await self.process.wait()
        self.stopped = False

    def signal(self, signum: int) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signum)
        self.stopped = signum == signal.SIGSTOP

    async def stop(self, grace: float) -> int | None:
        """SIGCONT (if paused), SIGTERM, wait; the exit code (None: it had to be killed)."""
        if self.process is None or self.process.returncode is not None:
            return None if self.process is None else self.process.returncode
        self.expected_exit = True
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), grace)
        except TimeoutError:
            await self.kill()
            return None


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Run:
    settings: argparse.Namespace
    rng: random.Random
    server: EmbeddedPostgres
    database_url: str
    pool: AsyncConnectionPool
    services: Services
    org: UUID
    gateway: GatewayProcess
    workers: list[WorkerProcess]
    proxies: list[FaultProxy]
    faults: Counter[str] = field(default_factory=Counter)
    notes: Counter[str] = field(default_factory=Counter)
    drop_rules: list[Any] = field(default_factory=list)
    busy: set[int] = field(default_factory=set)
    infra: asyncio.Lock = field(default_factory=asyncio.Lock)
    created: int = 0
    stale_worker: WorkerSettings | None = None  # the soak's own worker for ``stale_write``

    async def rows(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(query, params)
            return list(await cur.fetchall())


async def patiently(what: str, action: Callable[[], Awaitable[Any]], *, within: float = 120.0) -> Any:
    """``action()`` until it works (the database may be restarting), at most ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await action()
        except (psycopg.Error, OSError, TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: still failing after {within:g}s: {exc}") from exc
            await asyncio.sleep(0.5)


# --- feeder -------------------------------------------------------------------------------------


async def feed(run: Run, seconds: float) -> None:
    """Create the M tasks evenly over ``seconds``: one single-step profile scan each (scan, job and
    task in one transaction). Its targets name the task's number, so after an error whose commit
    is in doubt (a crashed server) the feeder looks before creating it again."""
    s = run.settings
    step = ProfileStep(task_type=TASK_TYPE, max_attempts=s.max_attempts, lease_seconds=s.lease_seconds,
                       execution_timeout_seconds=600)
    started = time.monotonic()
    for n in range(s.tasks):
        delay = started + n * seconds / s.tasks - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        targets = {"targets": [f"chaos-{n}"]}
        while True:
            try:
                await run.services.scans.create_scan(run.org, targets, profile=[step], execution_mode="gateway")
                break
            except Exception as exc:  # the server may be restarting; did the commit happen?
                run.notes["feeder_retries"] += 1
                if (not isinstance(exc, psycopg.Error | OSError | TimeoutError | Unavailable)
                        and "connection" not in str(exc)):
                    log(f"feeder: unexpected error creating task {n}: {type(exc).__name__}: {exc}")
                await asyncio.sleep(0.5)
                found = await patiently("feeder", lambda t=targets: run.rows(
                    "SELECT count(*) FROM scans WHERE targets = %s", t))
                if found[0][0]:
                    run.notes["feeder_commit_in_doubt_found"] += 1
                    break
        run.created = n + 1


# --- faults -------------------------------------------------------------------------------------


async def inject(run: Run, kind: str) -> None:
    s, rng = run.settings, run.rng
    past_lease = s.lease_seconds + rng.uniform(1.0, 3.0)
    if kind in ("gateway_restart", "pg_restart"):
        async with run.infra:
            run.faults[kind] += 1
            if kind == "gateway_restart":
                await run.gateway.kill()
                await asyncio.sleep(rng.uniform(0.3, 1.5))
                await start_gateway(run)
            else:
                await asyncio.to_thread(run.server.restart, "immediate")
        return
    deadline = time.monotonic() + 30
    while not (free := [w.index for w in run.workers if w.index not in run.busy]):
        if time.monotonic() > deadline:  # every worker is in another fault all that time
            run.notes[f"{kind}_skipped_all_workers_busy"] += 1
            return
        await asyncio.sleep(0.2)
    i = rng.choice(free)
    worker, proxy = run.workers[i], run.proxies[i]
    run.busy.add(i)
    run.faults[kind] += 1
    try:
        if kind == "worker_kill":
            await worker.kill()
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            await worker.start()
        elif kind == "worker_stop":
            worker.signal(signal.SIGSTOP)
            await asyncio.sleep(past_lease + 0.5)  # + one sweep: the Gateway has expired its leases
            worker.signal(signal.SIGCONT)
        elif kind in ("blackhole", "partition"):
            proxy.mode = Fault.BLACKHOLE if kind == "blackhole" else Fault.PARTITION
            await asyncio.sleep(past_lease)
            proxy.mode = Fault.PASS
        elif kind == "drop_response":
            run.drop_rules.append(proxy.add_rule(Fault.DROP_RESPONSE, times=rng.randint(1, 3)))
            await asyncio.sleep(rng.uniform(0.5, 2.0))
    finally:
        run.busy.discard(i)


async def stale_write(run: Run) -> asyncio.Task[None]:
    """``stale_write``: the soak's own worker takes a lease (the first task, before the workers
    start), writes nothing until the Gateway has expired it, then renews it. The renewal must be
    refused (409 ``lease-lost``, recorded as ``WriteRejected``); the task goes back to the queue.
    Returns once the lease is taken; the rest runs in the returned task."""
    assert run.stale_worker is not None
    client = GatewayClient(run.stale_worker)
    await client.__aenter__()
    try:
        deadline = time.monotonic() + 60
        while (answer := await client.acquire(f"stale-{time.monotonic_ns()}", wait_seconds=5)).lease is None:
            if time.monotonic() > deadline:
                raise RuntimeError("stale_write: no lease within 60s")
    except BaseException:
        await client.close()
        raise
    lease = answer.lease
    run.faults["stale_write"] += 1

    async def stall_then_write() -> None:
        try:
            async def expired() -> bool:
                rows = await run.rows("SELECT status FROM worker_task_attempts WHERE id = %s", lease.attempt_id)
                return bool(rows) and rows[0][0] == "expired"

            deadline = time.monotonic() + 120
            while not await patiently("stale_write", expired):  # the Gateway's sweeper ends the lease
                if time.monotonic() > deadline:
                    raise RuntimeError("stale_write: the Gateway did not expire the lease within 120s")
                await asyncio.sleep(0.2)
            try:  # retried while the Gateway or PostgreSQL restarts, until it is answered
                await asyncio.wait_for(client.renew(AttemptRef(lease.task.id, lease.attempt_id, lease.lease_token)),
                                       120)
            except LeaseLost:
                run.notes["stale_write_refused"] += 1
            else:
                run.notes["stale_write_accepted"] += 1  # a bug: a write on an expired lease
                log("stale_write: the Gateway accepted a renewal of an expired lease")
        finally:
            await client.close()

    return asyncio.create_task(stall_then_write())


async def start_gateway(run: Run) -> None:
    for _ in range(3):
        try:
            await run.gateway.start()
            return
        except RuntimeError as exc:
            run.notes["gateway_start_retries"] += 1
            log(f"gateway start failed, retrying: {exc}")
            await run.gateway.kill()
    await run.gateway.start()


async def schedule(run: Run, seconds: float) -> None:
    """Faults for ``seconds``: rounds of every kind (weighted), shuffled, one every ~interval."""
    kinds = [k for k in KINDS if k in run.settings.kinds]
    deadline = time.monotonic() + seconds
    running: set[asyncio.Task[None]] = set()
    deck = [k for k in kinds for _ in range(WEIGHTS[k])]
    run.rng.shuffle(deck)
    # The first round is dealt in full even when the window is over (what is left of it at once):
    # every kind comes up at least once.
    while deck or time.monotonic() < deadline:
        if not deck:
            deck = [k for k in kinds for _ in range(WEIGHTS[k])]
            run.rng.shuffle(deck)
        if not deck:  # no dealt kind chosen (``--kinds stale_write``): the window passes quietly
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            break
        task = asyncio.create_task(inject(run, deck.pop()))
        running.add(task)
        task.add_done_callback(running.discard)
        await asyncio.sleep(min(run.rng.uniform(0.5, 1.5) * run.settings.fault_interval,
                                max(0.0, deadline - time.monotonic())))
    if running:
        done = await asyncio.gather(*running, return_exceptions=True)
        for result in done:
            if isinstance(result, BaseException):
                raise result


async def watch(run: Run) -> None:
    """Restart a worker or Gateway that died without being told to (and count it: a bug)."""
    while True:
        await asyncio.sleep(0.5)
        for worker in run.workers:
            p = worker.process
            if p is not None and p.returncode is not None and not worker.expected_exit:
                worker.unexpected_exits.append(p.returncode)
                run.notes["unexpected_worker_exits"] += 1
                log(f"worker {worker.index} exited by itself with {p.returncode}; starting it again")
                await worker.start()
        if not run.infra.locked() and not run.gateway.alive:
            run.notes["unexpected_gateway_exits"] += 1
            log("the Gateway exited by itself; starting it again")
            async with run.infra:
                await start_gateway(run)


async def progress(run: Run, started: float) -> None:
    while True:
        await asyncio.sleep(run.settings.progress_seconds)
        with contextlib.suppress(psycopg.Error, OSError, TimeoutError):
            states = dict(await run.rows("SELECT state, count(*) FROM worker_tasks GROUP BY state"))
            log(f"t={time.monotonic() - started:.0f}s created={run.created} "
                + " ".join(f"{k}={v}" for k, v in sorted(states.items()))
                + " faults=" + ",".join(f"{k}:{v}" for k, v in sorted(run.faults.items())))


async def drain(run: Run, within: float, task_type: str | None = None) -> float:
    """Wait until every task (of ``task_type``, when given) is terminal; seconds it took (``inf``
    when it did not)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        with contextlib.suppress(psycopg.Error, OSError, TimeoutError):
            [(open_tasks, total)] = await run.rows(
                "SELECT count(*) FILTER (WHERE state = ANY(%s)), count(*) FROM worker_tasks "
                "WHERE %s::text IS NULL OR task_type = %s", list(NON_TERMINAL), task_type, task_type)
            if open_tasks == 0 and total >= run.settings.tasks:
                return time.monotonic() - started
        await asyncio.sleep(1.0)
    return float("inf")


# --- the checker --------------------------------------------------------------------------------


async def check(conn: psycopg.AsyncConnection[Any], expected_tasks: int,
                task_type: str | None = None) -> dict[str, Any]:
    """Per task id: the counts that must all be 0, and what the faults did (effects). With
    ``task_type``, only the tasks of that type (a run that also drives other tasks of its own)."""
    only = {"t": task_type}  # %(t)s NULL: every task

    async def fetch(query: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        cur = await conn.execute(query, params)
        return list(await cur.fetchall())

    tasks = {r[0]: r[1:] for r in await fetch(
        "SELECT id, state, attempt_count, max_attempts, current_attempt_id, scope -> 'targets' ->> 0 "
        "FROM worker_tasks WHERE %(t)s::text IS NULL OR task_type = %(t)s", only)}
    attempts = {r[0]: r[1:] for r in await fetch(
        "SELECT a.id, a.task_id, a.status, a.lease_expires_at, a.finished_at FROM worker_task_attempts a "
        "JOIN worker_tasks t ON t.id = a.task_id WHERE %(t)s::text IS NULL OR t.task_type = %(t)s", only)}
    events: dict[UUID, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for task_id, kind, data in await fetch(
            "SELECT originator_id, event_type, data FROM analyst_events WHERE originator_id IN "
            "(SELECT id FROM worker_tasks WHERE %(t)s::text IS NULL OR task_type = %(t)s) "
            "ORDER BY originator_id, originator_version", only):
        events[task_id].append((kind, data))
    batches = await fetch("SELECT b.id, b.task_id, b.attempt_id, b.sequence_number, b.record_count, b.accepted_at "
                          "FROM worker_result_batches b JOIN worker_tasks t ON t.id = b.task_id "
                          "WHERE %(t)s::text IS NULL OR t.task_type = %(t)s", only)
    ingested = await fetch("SELECT o.batch_id, o.data ->> 'attempt', o.data ->> 'i' FROM raw_outputs o "
                           "JOIN worker_result_batches b ON b.id = o.batch_id JOIN worker_tasks t ON t.id = b.task_id "
                           "WHERE %(t)s::text IS NULL OR t.task_type = %(t)s", only)
    runs = await fetch("SELECT attempt_id, count(*), count(finished_at) FROM chaos_executions GROUP BY attempt_id")

    bad: dict[str, set[Any]] = defaultdict(set)
    effects: Counter[str] = Counter()
    numbers = Counter(t[4] for t in tasks.values())
    missing = expected_tasks - len({n for n in numbers if n})
    duplicated = {n for n, c in numbers.items() if c > 1}

    for task_id, (state, attempt_count, max_attempts, current, _) in tasks.items():
        if state in NON_TERMINAL:
            bad["stuck"].add(task_id)
        elif state != "completed":
            if attempt_count >= max_attempts:
                effects["exhausted"] += 1  # not lost: the RFC gives up after max_attempts
            else:
                bad["lost"].add(task_id)
        # Walk the task's stream: every accepted write must come from the current, live attempt.
        live, completions, seen_batches = None, 0, Counter()
        for kind, data in events[task_id]:
            attempt = data.get("attempt_id")
            effects[f"event_{kind}"] += 1
            if kind == "WriteRejected":
                effects[f"rejected_{data['command']}_{data['reason']}"] += 1
            elif kind == "TaskLeased":
                live = attempt
            elif kind in ("TaskStarted", "LeaseRenewed", "LeaseReissued", "ResultBatchAccepted", "TaskCompleted",
                          "AttemptFailed", "LeaseExpired", "AttemptTimedOut"):
                if attempt != live:
                    bad["stale_accepted" if kind in ("ResultBatchAccepted", "TaskCompleted")
                        else "stale_other_write"].add(task_id)
                if kind == "ResultBatchAccepted":
                    seen_batches[(attempt, data["sequence_number"])] += 1
                if kind in ("TaskCompleted", "AttemptFailed", "LeaseExpired", "AttemptTimedOut"):
                    live = None
                completions += kind == "TaskCompleted"
        if completions > 1 or sum(1 for a in attempts.values() if a[0] == task_id and a[1] == "succeeded") > 1:
            bad["completed_twice"].add(task_id)
        if any(c > 1 for c in seen_batches.values()):
            bad["ingested_twice"].add(task_id)
        if state == "completed" and (current is None or attempts[current][1] != "succeeded"):
            bad["completed_twice"].add(task_id)  # completed, but not by its current attempt

    # Batches against their attempts: accepted while the lease was live, holding its own records.
    per_batch = Counter(b for b, _, _ in ingested)
    by_record = Counter((a, i) for _, a, i in ingested)
    batch_attempt = {b[0]: b[2] for b in batches}
    for batch_id, task_id, attempt_id, _, record_count, accepted_at in batches:
        _, _, lease_expires_at, finished_at = attempts[attempt_id]
        if accepted_at >= lease_expires_at or (finished_at is not None and accepted_at > finished_at):
            bad["stale_accepted"].add(task_id)
        if per_batch[batch_id] != record_count:
            bad["ingested_twice"].add(task_id)
    for batch_id, attempt, _ in ingested:
        if attempt != str(batch_attempt[batch_id]):
            bad["stale_accepted"].add(attempts[batch_attempt[batch_id]][0])  # someone else's records
    for (attempt, _), count in by_record.items():
        if count > 1:
            bad["ingested_twice"].add(attempts[UUID(attempt)][0])

    # The side table: every attempt ran at most once; every completed attempt really ran.
    ran = {r[0]: (r[1], r[2]) for r in runs}
    for attempt_id, (count, _) in ran.items():
        if count > 1:
            bad["attempt_ran_twice"].add(attempt_id)
        if attempt_id not in attempts:
            bad["execution_without_attempt"].add(attempt_id)
    for attempt_id, (task_id, status, _, _) in attempts.items():
        if status == "succeeded" and ran.get(attempt_id, (0, 0))[1] == 0:
            bad["completed_without_execution"].add(task_id)
    effects["executions"] = sum(c for c, _ in ran.values())
    effects["executions_finished"] = sum(f for _, f in ran.values())
    effects["attempts"] = len(attempts)
    effects["retried_tasks"] = sum(1 for t in tasks.values() if t[1] > 1)

    counts = {name: len(bad[name]) for name in (
        "lost", "completed_twice", "stale_accepted", "ingested_twice", "stuck",
        "attempt_ran_twice", "completed_without_execution", "execution_without_attempt", "stale_other_write")}
    counts["lost"] += max(0, missing)
    counts["created_twice"] = len(duplicated)
    examples = {name: sorted(str(x) for x in ids)[:5] for name, ids in bad.items() if ids}
    return {"tasks": len(tasks), "completed": sum(1 for t in tasks.values() if t[0] == "completed"),
            "counts": counts, "effects": dict(sorted(effects.items())), "examples": examples}


def replay(command: str, url: str) -> dict[str, Any]:
    leasehold = Path(sys.executable).with_name("leasehold")
    done = subprocess.run([str(leasehold), "replay", command, "--database-url", url, "--json", "--no-progress"],
                          capture_output=True, text=True, check=False)
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        answer = {"ok": False, "error": (done.stderr or done.stdout).strip()[-2000:]}
    answer["exit_code"] = done.returncode
    return answer


# --- main ---------------------------------------------------------------------------------------


async def provision(settings: argparse.Namespace, workdir: Path, server: EmbeddedPostgres) -> Run:
    url = recreate_database(server.url(), DATABASE)
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SIDE_TABLE)
    pool = create_pool(url, min_size=2, max_size=6, check=AsyncConnectionPool.check_connection)
    await pool.open()
    services = build_services(Database(pool))
    registry = services.registry
    org = await registry.create_organization("chaos")
    pki = init_pki(workdir / "pki")
    plugins = workdir / "plugins"
    plugins.mkdir()
    wrapper = plugins / TASK_TYPE
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -S {ROOT / 'bench' / 'chaos_plugin.py'}\n")
    wrapper.chmod(0o755)
    gateway = GatewayProcess(url, pki.directory, workdir / "gateway.log", settings)
    workers, proxies = [], []
    for i in range(settings.workers):
        name = f"chaos-{i}"
        cert = issue_worker_certificate(pki.directory, name)
        worker_id = await registry.register_worker(name=name, fingerprint=cert.fingerprint, task_types=(TASK_TYPE,),
                                                   max_concurrent_tasks=settings.concurrency)
        await registry.assign_worker(worker_id, org)
        proxy = FaultProxy(gateway.worker_port)
        await proxy.start()
        proxies.append(proxy)
        argv = ["--gateway", proxy.url(), "--cert", str(cert.cert_path), "--key", str(cert.key_path),
                "--ca", str(pki.ca_cert), "--plugins-dir", str(plugins), "--capability", TASK_TYPE,
                "--max-concurrency", str(settings.concurrency), "--log-format", "json", "--wait-seconds", "5",
                "--batch-records", "2", "--batch-seconds", "0.5", "--kill-grace-seconds", "1",
                "--request-timeout-seconds", str(settings.request_timeout_seconds),
                "--backoff-initial-seconds", "0.1", "--backoff-max-seconds", "1", "--shutdown-grace-seconds", "10"]
        env = {**os.environ, "CHAOS_DATABASE_URL": url, "CHAOS_PSQL": str(_bin_dir() / "psql"),
               "CHAOS_WORKER": name, "CHAOS_WORK_SECONDS": settings.work_seconds,
               "CHAOS_LONG_SHARE": str(settings.long_share),
               "CHAOS_LONG_SECONDS": str(settings.long_seconds or 1.5 * settings.lease_seconds),
               "CHAOS_RECORDS": "3"}
        workers.append(WorkerProcess(i, argv, env, workdir / f"worker-{i}.log"))
    run = Run(settings, random.Random(settings.seed), server, url, pool, services, org, gateway, workers, proxies)
    if "stale_write" in settings.kinds:
        cert = issue_worker_certificate(pki.directory, STALE_WORKER)
        worker_id = await registry.register_worker(name=STALE_WORKER, fingerprint=cert.fingerprint,
                                                   task_types=(TASK_TYPE,), max_concurrent_tasks=1)
        await registry.assign_worker(worker_id, org)
        run.stale_worker = WorkerSettings(
            gateway=f"https://localhost:{gateway.worker_port}", cert=cert.cert_path, key=cert.key_path,
            ca=pki.ca_cert, max_concurrency=1, capabilities=[TASK_TYPE],
            request_timeout_seconds=settings.request_timeout_seconds,
            backoff_initial_seconds=0.1, backoff_max_seconds=1)
    return run


async def soak(settings: argparse.Namespace, workdir: Path, server: EmbeddedPostgres) -> dict[str, Any]:
    run = await provision(settings, workdir, server)
    started = time.monotonic()
    helpers: list[asyncio.Task[None]] = []
    try:
        await start_gateway(run)
        feeder = asyncio.create_task(feed(run, settings.fault_seconds * 0.9))
        stale = None if run.stale_worker is None else await stale_write(run)  # before the workers compete
        for worker in run.workers:
            await worker.start()
        log(f"{settings.workers} workers, {settings.tasks} tasks, {settings.fault_seconds:g}s of faults "
            f"(lease {settings.lease_seconds}s, seed {settings.seed}); logs in {workdir}")
        helpers = [asyncio.create_task(watch(run)), asyncio.create_task(progress(run, started))]
        await schedule(run, settings.fault_seconds)
        fault_window = time.monotonic() - started
        await feeder
        if stale is not None:
            await stale
        # Heal: every proxy passes, every worker runs, the Gateway is up.
        for proxy in run.proxies:
            proxy.clear()
        for worker in run.workers:
            if worker.stopped:
                worker.signal(signal.SIGCONT)
        log(f"faults over after {fault_window:.0f}s; draining")
        drain_seconds = await drain(run, settings.drain_seconds)
        for helper in helpers:
            helper.cancel()
        exits = [await w.stop(30) for w in run.workers]
        gateway_exit = await run.gateway.stop()
        total = time.monotonic() - started
        async with await psycopg.AsyncConnection.connect(run.database_url) as conn:
            result = await check(conn, settings.tasks)
        verify, chain = replay("verify", run.database_url), replay("verify-chain", run.database_url)
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

    faults = {kind: run.faults[kind] for kind in KINDS if kind in settings.kinds}
    dropped = sum(rule.hits for rule in run.drop_rules)
    ok = (all(v == 0 for v in result["counts"].values()) and verify.get("ok") is True and chain.get("ok") is True
          and drain_seconds != float("inf") and result["tasks"] >= settings.tasks)
    return {
        "ok": ok, "workers": settings.workers, "tasks": settings.tasks, "lease_seconds": settings.lease_seconds,
        "seed": settings.seed, "counts": result["counts"], "examples": result["examples"],
        "completed": result["completed"], "faults": faults, "responses_dropped": dropped,
        "notes": dict(sorted(run.notes.items())), "effects": result["effects"],
        "verify": {"ok": verify.get("ok"), "events": verify.get("events"),
                   "differences": len(verify.get("differences", [])), "error": verify.get("error")},
        "verify_chain": {"ok": chain.get("ok"), "events": chain.get("events"), "streams": chain.get("streams"),
                         "checkpoints": chain.get("checkpoints"), "problems": len(chain.get("problems", [])),
                         "error": chain.get("error")},
        "seconds": {"fault_window": round(fault_window, 1),
                    "drain": None if drain_seconds == float("inf") else round(drain_seconds, 1),
                    "total": round(total, 1)},
        "worker_exit_codes": exits, "gateway_exit_code": gateway_exit, "gateway_starts": run.gateway.starts,
        "workdir": str(workdir),
    }


def report(r: dict[str, Any]) -> None:
    c, e = r["counts"], r["effects"]
    print(f"chaos workers={r['workers']} tasks={r['tasks']} lease_seconds={r['lease_seconds']} seed={r['seed']} "
          f"fault_window_s={r['seconds']['fault_window']} drain_s={r['seconds']['drain']} total_s={r['seconds']['total']}")
    print("faults " + " ".join(f"{k}={v}" for k, v in r["faults"].items()) + f" responses_dropped={r['responses_dropped']}")
    print(f"check lost={c['lost']} completed_twice={c['completed_twice']} stale_accepted={c['stale_accepted']} "
          f"ingested_twice={c['ingested_twice']} stuck={c['stuck']}")
    print(f"check_extra attempt_ran_twice={c['attempt_ran_twice']} "
          f"completed_without_execution={c['completed_without_execution']} "
          f"execution_without_attempt={c['execution_without_attempt']} stale_other_write={c['stale_other_write']} "
          f"created_twice={c['created_twice']}")
    v, ch = r["verify"], r["verify_chain"]
    print(f"replay verify={'OK' if v['ok'] else 'FAILED'} events={v['events']} differences={v['differences']}"
          f"{' error=' + str(v['error']) if v['error'] else ''}; verify-chain={'OK' if ch['ok'] else 'FAILED'} "
          f"streams={ch['streams']} checkpoints={ch['checkpoints']} problems={ch['problems']}"
          f"{' error=' + str(ch['error']) if ch['error'] else ''}")
    rejected = {k.removeprefix("rejected_"): v for k, v in e.items() if k.startswith("rejected_")}
    print(f"effects completed={r['completed']} attempts={e.get('attempts', 0)} retried_tasks={e.get('retried_tasks', 0)} "
          f"exhausted={e.get('exhausted', 0)} executions={e.get('executions', 0)} "
          f"lease_expired={e.get('event_LeaseExpired', 0)} attempt_failed={e.get('event_AttemptFailed', 0)} "
          f"lease_reissued={e.get('event_LeaseReissued', 0)} write_rejected={e.get('event_WriteRejected', 0)}")
    print("rejected " + (" ".join(f"{k}={v}" for k, v in sorted(rejected.items())) or "none"))
    print("notes " + (" ".join(f"{k}={v}" for k, v in r["notes"].items()) or "none")
          + f" gateway_starts={r['gateway_starts']} worker_exit_codes={r['worker_exit_codes']}")
    for name, ids in r["examples"].items():
        print(f"example {name}: {' '.join(ids)}")
    print("result " + ("PASS" if r["ok"] else "FAIL"))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=8, help="worker processes (K)")
    p.add_argument("--tasks", type=int, default=5000, help="tasks (M), created over 90%% of the fault window")
    p.add_argument("--fault-seconds", type=float, default=600.0, help="length of the fault window")
    p.add_argument("--fault-interval", type=float, default=4.0, help="mean seconds between two faults")
    p.add_argument("--kinds", default=",".join(KINDS), help="fault kinds to use (comma-separated)")
    p.add_argument("--lease-seconds", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=3, help="tasks per worker at once")
    p.add_argument("--max-attempts", type=int, default=10)
    p.add_argument("--request-timeout-seconds", type=float, default=3.0, help="the workers' HTTP request limit")
    p.add_argument("--work-seconds", default="0.3,2.5", help="plugin run time range, min,max")
    p.add_argument("--long-share", type=float, default=0.05, help="share of runs longer than the lease")
    p.add_argument("--long-seconds", type=float, default=None, help="their run time (default 1.5 x lease)")
    p.add_argument("--gateway-processes", type=int, default=1)
    p.add_argument("--drain-seconds", type=float, default=600.0, help="how long the drain may take")
    p.add_argument("--progress-seconds", type=float, default=15.0, help="progress line period (stderr)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--pg-data-dir", type=Path, default=None,
                   help="data dir of an embedded server to use (and crash); default: a fresh one, removed after")
    p.add_argument("--workdir", type=Path, default=None, help="where logs and the PKI go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs) even when the run passes")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the lines")
    args = p.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(args.kinds) - set(KINDS)
    if unknown:
        p.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 30)
    return args


def main(argv: list[str] | None = None) -> int:
    settings = parse(argv)
    # The pools reconnect on their own after a crash; their warnings meanwhile are expected.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    workdir = settings.workdir or Path(tempfile.mkdtemp(prefix="leasehold-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    own_server = settings.pg_data_dir is None
    server = EmbeddedPostgres(settings.pg_data_dir or workdir / "pgdata")
    server.start()
    try:
        result = asyncio.run(soak(settings, workdir, server))
    finally:
        if own_server:
            server.stop("immediate")
    if settings.json:
        print(json.dumps(result))
    else:
        report(result)
    if result["ok"] and not settings.keep and settings.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
