"""Phases that degrade queues: the lifecycle under steady load while a session sits idle in a
transaction, then while a long reader holds a snapshot, then after both let go. Prints plain
``name value`` lines per phase, asserts nothing.

Each phase runs ``--loops`` concurrent lifecycles (create_task -> acquire -> complete with its
final batch, the service layer of ``bench/core_lifecycle.py``) for ``--phase-seconds``:

* ``baseline``: nothing else;
* ``idle_in_transaction``: another session ran ``BEGIN; SELECT txid_current()`` and sits idle:
  its transaction id holds back the xmin horizon, so no dead row version younger than it can be
  vacuumed or pruned;
* ``long_reader``: another session holds a ``REPEATABLE READ`` snapshot (a report's long query);
* ``released``: both gone; autovacuum may catch up.

Per phase: ``lifecycles_per_s``, ``acquire_p50_ms`` / ``acquire_p99_ms``, and for the hot tables
(``worker_tasks``, ``worker_task_attempts``, ``scan_jobs``) the dead row versions at its end
(``dead_<table>``) and the share of updates that were HOT during it (``hot_pct_<table>``), with
the load average. The tables' settings (fillfactor, autovacuum scale factor) are printed first.

Usage: ``.venv/bin/python bench/degrade.py [--loops 4] [--phase-seconds 30] [--database-url URL]``.
It drops and recreates ``leasehold_degrade_bench`` (``--database-name``) and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import percentile, recreate_database, resolve_server_url  # noqa: E402
from core_lifecycle import make_loop, one_lifecycle, provision  # noqa: E402

from leasehold.gateway.services import build_services  # noqa: E402
from leasehold.migrations import runner as migrate  # noqa: E402
from leasehold.persistence.connection import create_pool  # noqa: E402
from leasehold.persistence.transaction import Database  # noqa: E402

TABLES = ("worker_tasks", "worker_task_attempts", "scan_jobs")
PHASES = ("baseline", "idle_in_transaction", "long_reader", "released")


async def table_stats(url: str) -> dict[str, tuple[int, int, int]]:
    """Per hot table: (dead row versions, updates, HOT updates) as the statistics have them."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT relname, n_dead_tup, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                                 "WHERE relname = ANY(%s)", (list(TABLES),))
        return {name: (int(dead), int(upd), int(hot)) for name, dead, upd, hot in await cur.fetchall()}


async def hold(url: str, phase: str, release: asyncio.Event) -> None:
    """The phase's other session, until ``release`` is set."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        if phase == "idle_in_transaction":
            await conn.execute("SELECT txid_current()")
        else:
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            await conn.execute("SELECT count(*) FROM events")
        await release.wait()
        await conn.rollback()


async def main(args: argparse.Namespace) -> None:
    server_url, source = resolve_server_url(args.database_url)
    url = recreate_database(server_url, args.database_name)
    print(f"# server: {source}", flush=True)
    try:
        migrate.upgrade(url, "head")
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute("SELECT relname, coalesce(array_to_string(reloptions, ' '), 'defaults') "
                                     "FROM pg_class WHERE relname = ANY(%s) ORDER BY relname", (list(TABLES),))
            for name, options in await cur.fetchall():
                print(f"# {name}: {options}")
        pool = create_pool(url, min_size=args.loops + 1, max_size=args.loops + 2)
        await pool.open()
        services = build_services(Database(pool))
        loops = [await make_loop(services.registry, f"degrade-{i}") for i in range(args.loops)]
        for loop in loops:
            await provision(services.scans, loop, 200)
        for phase in PHASES:
            release = asyncio.Event()
            holder = asyncio.create_task(hold(url, phase, release)) if phase in ("idle_in_transaction",
                                                                                  "long_reader") else None
            await asyncio.sleep(0.2)
            before = await table_stats(url)
            steps: dict[str, list[float]] = {"create_task": [], "acquire": [], "submit_batch": [], "complete": []}
            deadline = time.monotonic() + args.phase_seconds

            async def run(loop: Any, deadline: float, steps: dict[str, list[float]]) -> int:
                count = 0
                while time.monotonic() < deadline:
                    await one_lifecycle(services.lifecycle, services.scans, loop, steps)
                    count += 1
                return count

            started = time.monotonic()
            done = sum(await asyncio.gather(*(run(loop, deadline, steps) for loop in loops)))
            elapsed = time.monotonic() - started
            release.set()
            if holder is not None:
                await holder
            await asyncio.sleep(1.0)  # the backends' statistics are flushed at most once a second
            after = await table_stats(url)
            acquire_ms = [s * 1e3 for s in steps["acquire"]]
            print(f"{phase}_lifecycles_per_s {done / elapsed:.1f}")
            print(f"{phase}_acquire_p50_ms {percentile(acquire_ms, 50):.2f}")
            print(f"{phase}_acquire_p99_ms {percentile(acquire_ms, 99):.2f}")
            for table in TABLES:
                dead, upd, hot = after.get(table, (0, 0, 0))
                upd0, hot0 = before.get(table, (0, 0, 0))[1:]
                print(f"{phase}_dead_{table} {dead}")
                print(f"{phase}_hot_pct_{table} {100 * (hot - hot0) / max(upd - upd0, 1):.0f}")
            print(f"{phase}_load_avg_1m {os.getloadavg()[0]:.2f}", flush=True)
        await pool.close()
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.database_name)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", type=int, default=4)
    parser.add_argument("--phase-seconds", type=float, default=30.0)
    parser.add_argument("--database-url")
    parser.add_argument("--database-name", default="leasehold_degrade_bench")
    asyncio.run(main(parser.parse_args()))
