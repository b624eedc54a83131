"""Bulk retry soak: N failed tasks retried by one bulk operation whose runner process is SIGKILLed
halfway; a second runner process carries it on. Prints plain ``name value`` lines, asserts nothing.

* ``tasks``: N failed_terminal tasks made through the service layer (``--tasks``, default 10,000);
* ``reached_at_kill``: tasks the first runner had reached when it was killed;
* ``first_runner_tasks_per_s`` / ``second_runner_tasks_per_s``: tasks reached per second by each;
* ``handover_seconds``: from the kill to the second runner's first reached task (the hold, ``--hold``);
* ``retried_once`` / ``retried_twice`` / ``not_retried``: tasks with exactly one, more than one, or no
  ``TaskRetried`` event (the correct result: N / 0 / 0);
* ``done`` / ``skipped`` / ``failed``: the operation's own counts; ``load_avg_1m``.

Each runner is a process of its own running the Gateway's bulk loop (``gateway.background.bulk``)
on its own pool, as a Gateway process does; the kill is a SIGKILL (no shutdown, connections cut).

Usage: ``.venv/bin/python bench/bulk.py [--tasks 10000] [--hold 2] [--database-url URL]``. It drops
and recreates the database ``leasehold_bulk_bench`` (``--database-name``) and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from common import recreate_database, resolve_server_url  # noqa: E402

from leasehold.gateway.background import bulk as bulk_loop  # noqa: E402
from leasehold.gateway.commands.bulk import TaskFilter  # noqa: E402
from leasehold.gateway.commands.lifecycle import TaskSpec  # noqa: E402
from leasehold.gateway.services import build_services  # noqa: E402
from leasehold.migrations import runner as migrate  # noqa: E402
from leasehold.persistence.connection import create_pool  # noqa: E402
from leasehold.persistence.transaction import Database  # noqa: E402
from support.bulk import failed_tasks  # noqa: E402


async def run_forever(url: str, hold: float, batch: int) -> None:
    """The runner process: the Gateway's bulk loop, until killed."""
    pool = create_pool(url, min_size=1, max_size=4)
    await pool.open()
    await bulk_loop.run(build_services(Database(pool)).bulk, 0.2, batch, hold=hold)


async def reached(url: str, operation: UUID) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM bulk_operation_tasks WHERE operation_id = %s", (operation,))
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def status_of(url: str, operation: UUID) -> str:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT status FROM bulk_operations WHERE id = %s", (operation,))
        row = await cur.fetchone()
        return str(row[0]) if row else "?"


def runner(url: str, hold: float, batch: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--runner", "--runner-url", url, "--hold", str(hold),
                             "--batch", str(batch)], cwd=ROOT)


async def main(args: argparse.Namespace) -> None:
    server_url, source = resolve_server_url(args.database_url)
    url = recreate_database(server_url, args.database_name)
    print(f"# server: {source}", flush=True)
    try:
        migrate.upgrade(url, "head")
        pool = create_pool(url, min_size=1, max_size=8)
        await pool.open()
        services = build_services(Database(pool))
        org = await services.registry.create_organization("bulk-bench")
        scan = await services.scans.create_scan(org, {"targets": ["192.0.2.10"]})
        await services.lifecycle.create_task(scan, TaskSpec(task_type="hold"))  # keeps the scan open
        started = time.monotonic()
        parts = [args.tasks // args.makers + (1 if i < args.tasks % args.makers else 0) for i in range(args.makers)]
        await asyncio.gather(*(failed_tasks(services, org, scan, n, task_type=f"flaky-{i}")
                               for i, n in enumerate(parts) if n))
        print(f"setup_seconds {time.monotonic() - started:.1f}", flush=True)
        operation = await services.bulk.start("retry", TaskFilter(organization_id=org, state="failed_terminal"),
                                              reason="bench", actor="bench", organization_id=org)
        first = runner(url, args.hold, args.batch)
        while await reached(url, operation) == 0:  # noqa: ASYNC110 - the database is polled
            await asyncio.sleep(0.01)
        began = time.monotonic()  # the runner's first task (its start-up, imports and pool, left out)
        while await reached(url, operation) < args.tasks // 2:  # noqa: ASYNC110 - the database is polled
            await asyncio.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed_at, at_kill = time.monotonic(), await reached(url, operation)
        second = runner(url, args.hold, args.batch)
        while at_kill < args.tasks and await reached(url, operation) == at_kill:  # noqa: ASYNC110 - polled
            await asyncio.sleep(0.01)
        resumed_at = time.monotonic()  # (at once when the first runner had reached every task)
        while await status_of(url, operation) == "running":  # noqa: ASYNC110 - the database is polled
            await asyncio.sleep(0.05)
        ended_at = time.monotonic()
        second.terminate()
        second.wait()
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FILTER (WHERE n = 1), count(*) FILTER (WHERE n > 1) FROM ("
                " SELECT originator_id, count(*) AS n FROM events WHERE topic LIKE '%%TaskRetried' GROUP BY 1) x")
            once, twice = await cur.fetchone() or (0, 0)
            cur = await conn.execute("SELECT done, skipped, failed, status FROM bulk_operations WHERE id = %s",
                                     (operation,))
            done, skipped, failed, status = await cur.fetchone() or (0, 0, 0, "?")
        await pool.close()
        print(f"tasks {args.tasks}")
        print(f"reached_at_kill {at_kill}")
        print(f"first_runner_tasks_per_s {(at_kill - 1) / max(killed_at - began, 1e-6):.1f}")
        print(f"handover_seconds {resumed_at - killed_at:.2f}")
        print(f"second_runner_tasks_per_s {(args.tasks - at_kill) / max(ended_at - resumed_at, 1e-6):.1f}")
        print(f"retried_once {once}")
        print(f"retried_twice {twice}")
        print(f"not_retried {args.tasks - once - twice}")
        print(f"done {done}")
        print(f"skipped {skipped}")
        print(f"failed {failed}")
        print(f"status {status}")
        print(f"load_avg_1m {os.getloadavg()[0]:.2f}")
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.database_name)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--makers", type=int, default=4, help="concurrent makers of the failed tasks")
    parser.add_argument("--hold", type=float, default=2.0, help="the runners' hold (bulk_hold_seconds)")
    parser.add_argument("--batch", type=int, default=200, help="the runners' batch (bulk_batch)")
    parser.add_argument("--database-url")
    parser.add_argument("--database-name", default="leasehold_bulk_bench")
    parser.add_argument("--runner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--runner-url", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.runner:
        asyncio.run(run_forever(parsed.runner_url, parsed.hold, parsed.batch))
    else:
        asyncio.run(main(parsed))
