"""Replay benchmark: rebuild speed (events/s) and verify time on a generated log of ≥ 1M events.

Prints plain ``name value`` lines, asserts nothing. Steps:

1. **Sample.** Run the real service layer (:class:`gateway.commands.Lifecycle` and
   :class:`~gateway.commands.Registry`, ManualClock) for ``--sample-scans`` scans of
   ``--tasks-per-scan`` tasks, cycling through lifecycle shapes: plain success with a partial and
   a final batch, retry after a failure, lease expiry then retry, cancellation acknowledged by the
   worker, a stale write rejected, a terminal failure, a cancel before any lease. This gives
   realistic event payloads and the live projection rows the Gateway wrote for them.
2. **Replicate.** Copy the sample until the log holds ``--events`` events: each copy maps every
   UUID of the sample (in event states, in projection rows, in actors and idempotency keys) to a
   fresh one, gives organisations and worker fingerprints unique values, recomputes every hash
   chain with :func:`persistence.chain.chain_hash`, and points each projection row's
   ``head_hash`` at its stream's new head. Everything is bulk-loaded with COPY (with
   ``session_replication_role = replica`` for the load, to skip foreign-key triggers).
   A checkpoint is written before the last 1% of the copies (at least one copy) is loaded.
3. **Measure** on that log, through the same functions ``leasehold replay`` runs (after a
   yardstick: streaming the event columns a rebuild reads without decoding anything, the I/O
   floor on this server):
   ``verify-chain`` (the recomputed chains must verify), then ``leasehold replay rebuild
   --schema``, ``verify`` and ``verify --since`` that checkpoint, each in a process of its own
   (events/s, and its peak RSS with its parallel children's), and the first ``checkpoint`` after
   it and an incremental one.

Usage: ``.venv/bin/python bench/replay.py [--events 1000000] [--jobs N] [--database-url URL] [--profile FILE]``.
It drops and recreates the databases ``leasehold_replay_bench`` and ``leasehold_replay_bench_sample``
(``--database-name``) on the server (``--database-url`` to a maintenance database, else
``$BENCH_DATABASE_URL``, else the machine server on 127.0.0.1:5432 if it answers, else the
embedded server), both migrated with :func:`migrations.runner.upgrade`; it drops the sample
database when the log is generated.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import io
import os
import pstats
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import orjson
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import recreate_database, resolve_server_url  # noqa: E402

from leasehold.cli.embedded import redact_url, with_database  # noqa: E402
from leasehold.domain.errors import LeaseholdError  # noqa: E402
from leasehold.domain.results import payload_sha256  # noqa: E402
from leasehold.gateway.commands.lifecycle import Lifecycle, TaskSpec  # noqa: E402
from leasehold.gateway.services import build_services  # noqa: E402
from leasehold.migrations import runner as migrate  # noqa: E402
from leasehold.persistence.chain import GENESIS, chain_hash  # noqa: E402
from leasehold.persistence.checkpoints import write_checkpoint  # noqa: E402
from leasehold.persistence.connection import connect, create_pool  # noqa: E402
from leasehold.persistence.event_log import event_batches  # noqa: E402
from leasehold.persistence.tables import GENERATED_COLUMNS  # noqa: E402
from leasehold.persistence.transaction import Database  # noqa: E402
from leasehold.projections.rows import TABLE_ORDER  # noqa: E402
from leasehold.replay.integrity import verify_log  # noqa: E402
from leasehold.replay.rebuild import rebuild_schema  # noqa: E402

BENCH_DB = "leasehold_replay_bench"  # the default --database-name
SHAPES = ("success", "retry", "expire", "cancel", "stale", "success", "terminal", "cancel_pending")
UUID_RE = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
UUID_STR_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


def recreate_migrated_database(server_url: str, name: str) -> str:
    url = recreate_database(server_url, name)
    migrate.upgrade(url, "head")
    return url


# --------------------------------------------------------------------------------- 1. sample


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2031, 3, 1, 8, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _records(rng: random.Random, n: int) -> list[dict[str, Any]]:
    return [{"type": "asset", "kind": rng.choice(["host", "service", "certificate"]),
             "value": f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
             "port": rng.choice([22, 80, 443, 8443]), "banner": "x" * rng.randint(0, 40)} for _ in range(n)]


async def run_sample(url: str, scans: int, tasks_per_scan: int) -> int:
    """Drive the service layer through every lifecycle shape; returns the tasks created."""
    pool = create_pool(url, min_size=1, max_size=4)
    await pool.open()
    clock = Clock()
    rng = random.Random(20310301)
    try:
        services = build_services(Database(pool), clock=clock, rng=random.Random(1))
        registry, lc = services.registry, services.lifecycle
        org = await registry.create_organization("bench-org", actor="operator:bench-key")
        workers = []
        for i in range(4):
            fp = hashlib.sha256(f"bench-worker-{i}".encode()).hexdigest()
            w = await registry.register_worker(name=f"scanner-{i}", fingerprint=fp, capabilities=("net",),
                                               task_types=("tcp_connect", "http_probe", "dns_resolve"),
                                               max_concurrent_tasks=4, actor="operator:bench-key")
            await registry.assign_worker(w, org, actor="operator:bench-key")
            workers.append(w)
        shape_no = 0
        for s in range(scans):
            scan = await services.scans.create_scan(org, {"targets": [f"10.{s % 250}.0.0/24"], "ports": [22, 80, 443]},
                                              actor="operator:bench-key")
            tasks = []
            for t in range(tasks_per_scan):
                plugin = ("tcp_connect", "http_probe", "dns_resolve")[t % 3]
                tasks.append(await lc.create_task(scan, TaskSpec(
                    task_type=plugin, required_capabilities=("net",), priority=tasks_per_scan - t,
                    scope={"targets": [f"10.{s % 250}.{t}.0/28"]}, parameters={"timeout": 5, "ports": [80, 443]},
                    max_attempts=3, lease_seconds=30, execution_timeout_seconds=600), actor="scheduler"))
            for task in tasks:
                shape = SHAPES[shape_no % len(SHAPES)]
                shape_no += 1
                worker = workers[shape_no % len(workers)]
                await _one_task(lc, clock, rng, worker, task.id, shape)
                clock.advance(rng.uniform(1, 20))
        return scans * tasks_per_scan
    finally:
        await pool.close()


async def _one_task(lc: Lifecycle, clock: Clock, rng: random.Random, worker: UUID, task_id: UUID,
                    shape: str) -> None:
    if shape == "cancel_pending":
        await lc.request_cancel(task_id, reason="operator cancelled the scan", actor="operator:bench-key")
        return
    a = await lc.acquire(worker, request_id=f"req-{uuid4()}")
    assert a is not None and a.task.id == task_id, (shape, a)
    args = (worker, a.task.id, a.attempt.id, a.lease_token)
    clock.advance(rng.uniform(0.05, 1))
    await lc.mark_running(*args)
    clock.advance(rng.uniform(1, 10))
    await lc.renew(*args)
    if shape in ("retry", "terminal"):
        await lc.fail(*args, error="connection refused by 10.0.0.1:443", retryable=shape == "retry")
        if shape == "terminal":
            return
        clock.advance(5)
    elif shape == "expire":
        clock.advance(31)
        await lc.expire_leases()
        clock.advance(5)
    elif shape == "cancel":
        await lc.request_cancel(task_id, reason="operator cancelled the scan", actor="operator:bench-key")
        await lc.renew(*args)
        clock.advance(rng.uniform(0.1, 2))
        await lc.acknowledge_cancel(*args)
        return
    elif shape == "stale":
        try:
            await lc.complete(worker, a.task.id, a.attempt.id, "not-the-token")
        except LeaseholdError:
            pass
    if shape in ("retry", "expire"):
        a = await lc.acquire(worker)
        assert a is not None and a.task.id == task_id, (shape, a)
        args = (worker, a.task.id, a.attempt.id, a.lease_token)
        await lc.mark_running(*args)
    for seq, final in ((1, False), (2, True)):
        records = _records(rng, rng.randint(1, 5))
        clock.advance(rng.uniform(0.5, 5))
        await lc.submit_batch(*args, sequence_number=seq, idempotency_key=f"{a.attempt.id}:{seq}",
                              payload_sha256=payload_sha256(records), records=records, final=final)
    clock.advance(rng.uniform(0.1, 1))
    await lc.complete(*args)


# ------------------------------------------------------------------------------ 2. replicate


class Sample:
    """The sample's events (log order), projection rows and payloads, read back from the database."""

    def __init__(self, url: str) -> None:
        with psycopg.connect(url) as conn:
            self.events: list[tuple[UUID, int, str, bytes, bytes]] = [
                (r[0], r[1], r[2], bytes(r[3]), bytes(r[4])) for r in conn.execute(
                    "SELECT originator_id, originator_version, topic, state, hash FROM events"
                    " ORDER BY notification_id")]
            self.tables: dict[str, tuple[list[str], list[tuple[Any, ...]]]] = {}
            for table in TABLE_ORDER:
                cur = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
                assert cur.description is not None
                names = [c.name for c in cur.description]
                # Generated columns are computed by PostgreSQL when the copies are loaded.
                keep = [i for i, name in enumerate(names) if name not in GENERATED_COLUMNS.get(table, ())]
                self.tables[table] = ([names[i] for i in keep],
                                      [tuple(bytes(r[i]) if isinstance(r[i], memoryview) else r[i] for i in keep)
                                       for r in cur.fetchall()])
            self.payloads = [(r[0], bytes(r[1])) for r in conn.execute("SELECT sha256, body FROM result_payloads")]
        self.uuids = sorted({m for _, _, _, state, _ in self.events for m in UUID_RE.findall(state)}
                            | {str(e[0]).encode() for e in self.events})
        self.fingerprints = sorted({r[2] for r in self.tables["workers"][1]})
        self.org_names = sorted({r[1] for r in self.tables["organizations"][1]})


def copies_needed(sample: Sample, events: int) -> int:
    return -(-events // len(sample.events))


def first_checkpoint(url: str) -> int | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT min(id) FROM checkpoints").fetchone()
    return None if row is None else row[0]


def replicate_and_load(sample: Sample, url: str, copies: int,
                       progress: Callable[[int], None] | None = None, checkpoint_after: int | None = None) -> int:
    """Load ``copies`` remapped copies of the sample; returns the number of events loaded. With
    ``checkpoint_after``, a checkpoint is written once that many copies are in."""
    loaded = 0
    with psycopg.connect(url) as conn:
        conn.execute("SET session_replication_role = replica")  # no FK triggers during the bulk load
        conn.execute("SET synchronous_commit = off")
        with conn.cursor().copy("COPY result_payloads (sha256, body) FROM STDIN") as copy:
            for row in sample.payloads:
                copy.write_row(row)
        conn.commit()
        for n in range(copies):
            loaded += _load_copy(conn, sample, n)
            conn.commit()
            if n + 1 == checkpoint_after:
                asyncio.run(_checkpoint(url))
            if progress is not None:
                progress(loaded)
    return loaded


def _load_copy(conn: psycopg.Connection[Any], sample: Sample, n: int) -> int:
    uuid_map = {u: str(uuid4()).encode() for u in sample.uuids}
    str_map = {k.decode(): v.decode() for k, v in uuid_map.items()}
    obj_map = {UUID(k): UUID(v) for k, v in str_map.items()}
    fp_map = {fp: hashlib.sha256(f"{fp}:{n}".encode()).hexdigest() for fp in sample.fingerprints}
    name_map = {name: f"{name}-{n}" for name in sample.org_names}
    hash_map: dict[bytes, bytes] = {}
    heads: dict[UUID, bytes] = {}

    def sub(m: re.Match[bytes]) -> bytes:
        return uuid_map[m.group()]

    with conn.cursor().copy("COPY events (originator_id, originator_version, topic, state, prev_hash, hash)"
                            " FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["uuid", "int8", "text", "bytea", "bytea", "bytea"])
        for oid, version, topic, state, old_hash in sample.events:
            new_oid = obj_map[oid]
            new_state = UUID_RE.sub(sub, state)
            if topic.endswith(":WorkerRegistered"):
                for old, new in fp_map.items():
                    new_state = new_state.replace(old.encode(), new.encode())
            elif topic.endswith(":OrganizationCreated"):
                for old, new in name_map.items():
                    new_state = new_state.replace(f'"name":"{old}"'.encode(), f'"name":"{new}"'.encode())
            prev = heads.get(new_oid, GENESIS)
            h = chain_hash(prev, new_oid, version, topic, new_state)
            heads[new_oid] = hash_map[old_hash] = h
            copy.write_row((new_oid, version, topic, new_state, prev, h))

    def remap(value: Any) -> Any:
        if isinstance(value, UUID):
            return obj_map.get(value, value)
        if isinstance(value, bytes):
            return hash_map.get(value, value)
        if isinstance(value, str):
            value = fp_map.get(value, name_map.get(value, value))
            return UUID_STR_RE.sub(lambda m: str_map.get(m.group(), m.group()), value)
        return value

    cur = conn.cursor()
    cur.adapters.register_dumper(dict, psycopg.types.json.JsonbDumper)
    for table in TABLE_ORDER:
        columns, rows = sample.tables[table]
        stmt = sql.SQL("COPY {} ({}) FROM STDIN").format(
            sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns)))
        with cur.copy(stmt) as copy:
            for row in rows:
                copy.write_row(tuple(remap(v) for v in row))
    return len(sample.events)


async def _checkpoint(url: str) -> None:
    async with await connect(url) as conn:
        await write_checkpoint(conn)


# -------------------------------------------------------------------------------- 3. measure


#: Runs one ``leasehold`` command in a child process and reports its peak resident memory (the
#: largest of the process and its own children: the parallel folds) on its last stderr line.
#: Its own is ``VmHWM``, not ``getrusage``: Linux carries the peak of the process that forked it
#: (this benchmark, which holds every checkpoint head after verify-chain) across ``exec``.
RUNNER = """
import re, resource, sys
from leasehold.cli.main import main
try:
    code = main(sys.argv[1:])
finally:
    with open("/proc/self/status") as status:
        own = int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1))
    rss = max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(f"peak_rss_kb {rss}", file=sys.stderr)
sys.exit(code)
"""


def run_command(*argv: str) -> tuple[dict[str, Any], float, int]:
    """``leasehold <argv> --json`` in a fresh process: (its JSON, wall seconds, peak RSS in KB)."""
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", RUNNER, *argv, "--json", "--no-progress"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t
    if done.returncode not in (0, 1):
        raise RuntimeError(f"leasehold {' '.join(argv)} failed:\n{done.stderr}")
    rss = int(done.stderr.strip().rsplit("peak_rss_kb ", 1)[1].split()[0])
    return orjson.loads(done.stdout), elapsed, rss


async def measure(url: str, jobs: int | None, since_checkpoint: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["load_average_before"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    async with await connect(url) as conn:
        # Yardstick: stream the columns a rebuild reads, decoding nothing (the I/O floor).
        t = time.perf_counter()
        async with conn.transaction():
            read = 0
            async for batch in event_batches(conn):
                read += len(batch)
        out["yardstick_read_events_per_s"] = round(read / (time.perf_counter() - t))
    async with await connect(url) as conn:
        t = time.perf_counter()
        report = await verify_log(conn)
        out["verify_chain_s"] = round(time.perf_counter() - t, 2)
        out["verify_chain_events_per_s"] = round(report.events / (time.perf_counter() - t))
        out["verify_chain_problems"] = len(report.problems)

    job_args = ("--jobs", str(jobs)) if jobs else ()
    rebuilt, wall, rss = run_command("replay", "rebuild", "--schema", "bench_rebuild", "--replace",
                                     "--database-url", url, *job_args)
    seconds = rebuilt["fold_seconds"] + rebuilt["load_seconds"]
    out["rebuild_events"] = rebuilt["events"]
    out["rebuild_s"] = round(seconds, 2)
    out["rebuild_fold_s"] = rebuilt["fold_seconds"]
    out["rebuild_load_s"] = rebuilt["load_seconds"]
    out["rebuild_rows"] = sum(rebuilt["rows"].values())
    out["rebuild_events_per_s"] = round(rebuilt["events"] / seconds) if seconds else 0
    out["rebuild_process_s"] = round(wall, 2)
    out["rebuild_peak_rss_mb"] = round(rss / 1024)

    verified, wall, rss = run_command("replay", "verify", "--database-url", url, *job_args)
    out["verify_s"] = verified["seconds"]
    out["verify_differences"] = len(verified["differences"])
    out["verify_events_per_s"] = round(verified["events"] / verified["seconds"]) if verified["seconds"] else 0
    out["verify_process_s"] = round(wall, 2)
    out["verify_peak_rss_mb"] = round(rss / 1024)

    if since_checkpoint is not None:
        since, wall, rss = run_command("replay", "verify", "--since", str(since_checkpoint), "--database-url", url,
                                       *job_args)
        with psycopg.connect(url) as conn:
            # The events an incremental verify sifts to find what is new: those of transactions from
            # the checkpoint's transaction_xmin on (held back by any transaction open on the server
            # when the checkpoint was taken).
            out["verify_since_candidate_events"] = conn.execute(
                "SELECT count(*) FROM events WHERE transaction_id >= (SELECT transaction_xmin FROM checkpoints"
                " WHERE id = %s)", (since_checkpoint,)).fetchone()[0]  # type: ignore[index]
        out["verify_since_events"] = since["events"]
        out["verify_since_differences"] = len(since["differences"])
        out["verify_since_s"] = since["seconds"]
        out["verify_since_process_s"] = round(wall, 2)
        out["verify_since_vs_full"] = round(since["seconds"] / verified["seconds"], 4) if verified["seconds"] else 0

    async with await connect(url) as conn:
        t = time.perf_counter()
        first = await write_checkpoint(conn)
        out["checkpoint_s"] = round(time.perf_counter() - t, 2)
        out["checkpoint_heads_sealed"] = first.changed_count
        t = time.perf_counter()
        second = await write_checkpoint(conn)
        out["checkpoint_incremental_s"] = round(time.perf_counter() - t, 3)
        out["checkpoint_incremental_heads"] = second.changed_count

    out["rebuild_vs_yardstick_read"] = round(out["rebuild_events_per_s"] / out["yardstick_read_events_per_s"], 2)
    out["peak_rss_mb"] = max(out["rebuild_peak_rss_mb"], out["verify_peak_rss_mb"])
    out["load_average_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return out


async def profile_rebuild(url: str, path: Path) -> None:
    async with await connect(url) as source, await connect(url) as target:
        profiler = cProfile.Profile()
        profiler.enable()
        await rebuild_schema(source, target, "bench_profile", replace=True)  # one process: all of it is profiled
        profiler.disable()
    profiler.dump_stats(str(path))
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(18)
        print(f"# profile by {key}:\n" + "\n".join("#   " + line for line in text.getvalue().splitlines()
                                                   if line.strip()))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", help="maintenance-database URL of the server to use")
    p.add_argument("--events", type=int, default=1_000_000, help="events in the generated log")
    p.add_argument("--database-name", default=BENCH_DB,
                   help="database to (re)create for the log; NAME_sample holds the sample while it is made")
    p.add_argument("--sample-scans", type=int, default=40)
    p.add_argument("--tasks-per-scan", type=int, default=6)
    p.add_argument("--reuse", action="store_true", help="measure the existing leasehold_replay_bench log")
    p.add_argument("--profile", type=Path, metavar="FILE", help="also cProfile one rebuild into FILE")
    p.add_argument("--jobs", type=int, help="processes for rebuild and verify (default: theirs, the cores)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server_url, source = resolve_server_url(args.database_url)
    url = with_database(server_url, args.database_name)
    print(f"server {redact_url(server_url)} ({source})")
    if not args.reuse:
        t0 = time.perf_counter()
        sample_url = recreate_migrated_database(server_url, args.database_name + "_sample")
        tasks = asyncio.run(run_sample(sample_url, args.sample_scans, args.tasks_per_scan))
        sample = Sample(sample_url)
        print(f"sample_tasks {tasks}")
        print(f"sample_events {len(sample.events)}")
        print(f"sample_s {time.perf_counter() - t0:.2f}")
        recreate_migrated_database(server_url, args.database_name)
        t0 = time.perf_counter()
        copies = copies_needed(sample, args.events)
        # A checkpoint before the last 1% of the copies: where the incremental verify starts.
        before_last = copies - max(1, copies // 100)
        loaded = replicate_and_load(sample, url, copies,
                                    lambda n: log(f"loaded {n} events") if n % 200_000 < len(sample.events) else None,
                                    checkpoint_after=before_last)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        print(f"generated_events {loaded}")
        print(f"generate_s {time.perf_counter() - t0:.2f}")
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(args.database_name + "_sample")))
    with psycopg.connect(url) as conn:
        events = conn.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]
    print(f"events {events}")
    since = first_checkpoint(url)
    results = asyncio.run(measure(url, args.jobs, since))
    for key, value in results.items():
        print(f"{key} {value}")
    print(f"goal_rebuild_events_per_s 100000 met={results['rebuild_events_per_s'] >= 100_000}")
    print(f"goal_verify_events_per_s 50000 met={results['verify_events_per_s'] >= 50_000}")
    if "verify_since_vs_full" in results:
        print(f"goal_verify_since_vs_full 0.02 met={results['verify_since_vs_full'] < 0.02}")
    if args.profile:
        asyncio.run(profile_rebuild(url, args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
