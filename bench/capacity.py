"""What a task costs the database to keep: events, WAL and storage per task, and what that makes
of a day's work. The inputs of the capacity model (docs/guides/deploy/capacity.md).

    .venv/bin/python bench/capacity.py                           # 2,000 tasks on a private server
    .venv/bin/python bench/capacity.py --tasks 20000 --renewals 5 --records 20
    .venv/bin/python bench/capacity.py --database-url postgresql://postgres@127.0.0.1:5522/postgres

Without ``--database-url`` it starts a private PostgreSQL (the embedded server's binaries, a data
directory under /tmp, removed at the end), so that the WAL counted is this run's alone; with one,
it drops and recreates the scratch database ``--database-name`` there, and counts whatever else
writes on that server as well.

Each task is the agent's lifecycle through the service layer: created in a scan of
``--tasks-per-scan`` tasks, acquired, marked running, renewed ``--renewals`` times, completed
with a final batch of ``--records`` asset records (so the scan's own events and rows are spread
over its tasks). ``--concurrency`` loops run them, each with its own organisation and worker.
Before the measured run: ``VACUUM ANALYZE`` and a ``CHECKPOINT`` (so the full-page images a
checkpoint causes are counted as they would be in steady state); after it: ``VACUUM`` (not
FULL), then every table's and index's size (``pg_total_relation_size``) compared with before.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from common import recreate_database

from leasehold.cli.embedded import EmbeddedPostgres, redact_url
from leasehold.domain.results import payload_sha256
from leasehold.gateway.commands.lifecycle import ResultBatch, TaskSpec
from leasehold.gateway.services import Services, build_services
from leasehold.migrations import runner as migrate
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database

SPEC = TaskSpec(task_type="capacity", scope={"hosts": ["capacity.example.test"]}, lease_seconds=60,
                execution_timeout_seconds=600)
#: Sizes of the model's daily volumes (tasks a day).
DAILY = (100_000, 1_000_000, 10_000_000)

# A partition counts under its partitioned table (the event log is partitioned by time).
_SIZES = """
SELECT root.relname, sum(pg_total_relation_size(c.oid))
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_class root ON root.oid = coalesce(pg_partition_root(c.oid), c.oid)
WHERE n.nspname = 'public' AND c.relkind = 'r'
GROUP BY root.relname
"""


def _state(url: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        tables = {name: int(size) for name, size in conn.execute(_SIZES).fetchall()}
        (wal,) = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").fetchone() or (0,)
        (events,) = conn.execute("SELECT count(*) FROM events").fetchone() or (0,)
        (database,) = conn.execute("SELECT pg_database_size(current_database())").fetchone() or (0,)
    return {"tables": tables, "wal": int(wal), "events": int(events), "database": int(database)}


def _maintain(url: str, *, checkpoint: bool) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        if checkpoint:
            conn.execute("CHECKPOINT")


async def _loop(services: Services, index: int, tasks: int, args: argparse.Namespace) -> None:
    registry, lifecycle, scans = services.registry, services.lifecycle, services.scans
    org = await registry.create_organization(f"capacity-{index}")
    worker = await registry.register_worker(name=f"capacity-worker-{index}", fingerprint=f"{index:064x}",
                                            task_types=("capacity",), max_concurrent_tasks=args.tasks_per_scan)
    await registry.assign_worker(worker, org)
    done = 0
    while done < tasks:
        scan = await scans.create_scan(org, {"hosts": ["capacity.example.test"]})
        batch = min(args.tasks_per_scan, tasks - done)
        for _ in range(batch):
            await lifecycle.create_task(scan, SPEC)
        for _ in range(batch):
            acquired = await lifecycle.acquire(worker)
            assert acquired is not None, "a created task was not leased"
            task, attempt, token = acquired.task.id, acquired.attempt.id, acquired.lease_token
            await lifecycle.mark_running(worker, task, attempt, token)
            for _ in range(args.renewals):
                await lifecycle.renew(worker, task, attempt, token)
            records = [{"type": "asset", "kind": "host", "value": f"h{i}.{task}.capacity.example.test"}
                       for i in range(args.records)]
            await lifecycle.complete(worker, task, attempt, token,
                                     final_batch=ResultBatch(1, "final", payload_sha256(records), records))
        done += batch


async def _run(url: str, args: argparse.Namespace) -> float:
    pool = create_pool(url, min_size=1, max_size=args.concurrency + 1)
    await pool.open()
    try:
        services = build_services(Database(pool))
        share = [args.tasks // args.concurrency + (1 if i < args.tasks % args.concurrency else 0)
                 for i in range(args.concurrency)]
        started = time.perf_counter()
        await asyncio.gather(*(_loop(services, i, n, args) for i, n in enumerate(share) if n))
        return time.perf_counter() - started
    finally:
        await pool.close()


def measure(server_url: str, args: argparse.Namespace) -> None:
    url = recreate_database(server_url, args.database_name)
    migrate.upgrade(url)
    with psycopg.connect(url) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        settings = dict(conn.execute("SELECT name, setting FROM pg_settings WHERE name IN "
                                     "('full_page_writes', 'wal_level', 'wal_compression', 'checkpoint_timeout', "
                                     "'max_wal_size', 'autovacuum')").fetchall())
    print(f"machine server={version[0] if version else '?'} url={redact_url(server_url)} "
          + " ".join(f"{k}={v}" for k, v in sorted(settings.items())), flush=True)
    _maintain(url, checkpoint=True)
    before = _state(url)
    seconds = asyncio.run(_run(url, args))
    wal = _state(url)["wal"] - before["wal"]  # before the VACUUM, whose own WAL is not the tasks'
    _maintain(url, checkpoint=False)
    after = _state(url)
    n = args.tasks
    events = after["events"] - before["events"]
    growth = {t: after["tables"].get(t, 0) - before["tables"].get(t, 0) for t in after["tables"]}
    storage = sum(growth.values())
    print(f"capacity tasks={n} tasks_per_scan={args.tasks_per_scan} renewals={args.renewals} "
          f"records={args.records} concurrency={args.concurrency} seconds={seconds:.1f} "
          f"tasks_per_s={n / seconds:.1f}")
    print(f"per_task events={events / n:.2f} wal_bytes={wal / n:.0f} storage_bytes={storage / n:.0f} "
          f"database_growth_bytes={(after['database'] - before['database']) / n:.0f}")
    for table, grew in sorted(growth.items(), key=lambda kv: -kv[1]):
        if grew > 0:
            print(f"per_task_table table={table} bytes={grew / n:.0f} share={grew / storage:.2f}")
    for daily in DAILY:
        print(f"per_day tasks={daily} events={events / n * daily:.0f} wal_gb={wal / n * daily / 1e9:.2f} "
              f"storage_gb={storage / n * daily / 1e9:.2f} storage_gb_30_days={storage / n * daily * 30 / 1e9:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="maintenance database of the server to use (default: a private one)")
    parser.add_argument("--database-name", default="leasehold_bench_capacity", help="scratch database (recreated)")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--tasks-per-scan", type=int, default=4)
    parser.add_argument("--renewals", type=int, default=2)
    parser.add_argument("--records", type=int, default=4, help="asset records in each task's final batch")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    if args.database_url:
        measure(args.database_url, args)
        return 0
    base = Path(tempfile.mkdtemp(prefix="leasehold-capacity-"))
    base.chmod(0o755)
    server = EmbeddedPostgres(base / "pgdata")
    try:
        server.start()
        measure(server.url(), args)
    finally:
        server.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
