"""What the per-test database costs: N cycles of each way to give a test a migrated database.

Each cycle gets a database, writes what a typical test writes (an organisation, a scan with a
job and a task, through the service layer), and gives the database back:

* ``drop``: ``CREATE DATABASE … TEMPLATE`` (WAL_LOG), ``DROP DATABASE … WITH (FORCE)`` after it;
* ``filecopy``: the same with ``STRATEGY FILE_COPY`` (a checkpoint before the copy, none at the drop);
* ``recycle``: :meth:`TestDatabases.checkout` and :meth:`TestDatabases.checkin` (the fixture's way).

Usage (from the project root; the embedded PostgreSQL 18 when no URL is given)::

    .venv/bin/python tests/support/bench_databases.py [--url postgresql://…/postgres] [-n 30]

It prints the median and mean of the get and give-back times of each mode, with the load average.
Other processes on the machine change the numbers: compare modes within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from leasehold.cli.embedded import EmbeddedPostgres, with_database
from leasehold.gateway.services import build_services
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database
from support.databases import TEST_DB_PREFIX, TestDatabases, ensure_template
from support.gateway import LOOPBACK_ALLOWED

MODES = ("drop", "filecopy", "recycle")


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def a_test_writes(url: str) -> None:
    pool = create_pool(url, min_size=1, max_size=2)
    await pool.open()
    try:
        services = build_services(Database(pool))
        org = await services.registry.create_organization("bench")
        await services.registry.set_target_policy(org, LOOPBACK_ALLOWED)
        await services.scans.create_scan(org, {"targets": ["127.0.0.1"]})
    finally:
        await pool.close()


def run(url: str, n: int, modes: list[str]) -> None:
    template = ensure_template(url)
    print(f"server {psycopg.connect(url).info.server_version}, {n} cycles per mode, load {load()}")
    for mode in modes:
        databases = TestDatabases(url, template, recycle=mode == "recycle")
        gets, gives = [], []
        started = time.perf_counter()
        for i in range(n):
            t0 = time.perf_counter()
            if mode == "filecopy":
                name = f"{TEST_DB_PREFIX}bench{i}"
                databases.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(template)))
                db_url = with_database(url, name)
            elif mode == "recycle":
                name, db_url = databases.checkout()
            else:
                name, db_url = databases.create()
            t1 = time.perf_counter()
            asyncio.run(a_test_writes(db_url))
            t2 = time.perf_counter()
            if mode == "recycle":
                databases.checkin(name)
            else:
                databases.drop(name)
            gets.append(t1 - t0)
            gives.append(time.perf_counter() - t2)
        total = time.perf_counter() - started
        databases.close()
        ms = 1000.0
        print(f"{mode:9s} get median {statistics.median(gets) * ms:4.0f} ms mean {statistics.mean(gets) * ms:4.0f}"
              f" | give back median {statistics.median(gives) * ms:4.0f} ms mean {statistics.mean(gives) * ms:4.0f}"
              f" | {total:5.1f} s for {n} cycles | {databases.counts} | load {load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a maintenance database (default: the embedded test server)")
    parser.add_argument("-n", type=int, default=30, help="cycles per mode")
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    server = None
    url = args.url
    if url is None:
        server = EmbeddedPostgres(Path(__file__).resolve().parents[2] / ".leasehold" / "test-pgdata",
                                  stop_at_exit=True)
        server.start()
        url = server.url("postgres")
    run(url, args.n, args.modes.split(","))


if __name__ == "__main__":
    main()
