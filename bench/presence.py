"""Worker presence benchmark: what publishing the last poll, renew and write of N workers costs.

Prints plain ``name value`` lines, asserts nothing. For each N in ``--workers`` it registers N
workers (plain rows, into a scratch database migrated to head) and then:

* ``publish_ms``: one publish of all N workers, each seen since the last one (the steady state of
  N workers that long-poll: ONE statement, one transaction), median of ``--rounds``;
* ``publish_idle_ms``: a pass with nothing seen (no statement at all), median;
* ``hot_update_ratio``: the share of a publish's row updates that stayed on their page (HOT, no
  index touched), over ``--rounds`` further publishes ``--pause`` seconds apart;
* ``wal_bytes_per_publish``: WAL written per publish of N workers, median;
* ``loop_transactions_per_s``: the database transactions of the real publish loop
  (``gateway.background.presence.run``) over ``--seconds`` while every one of the N workers is
  seen ``--polls-per-second`` times a second (in memory, as the acquire route notes a poll), at
  ``--interval``; and ``loop_polls`` (how many polls it absorbed), ``loop_statements``;
* through a real Gateway (in process, mTLS), ``--gateway-workers`` workers, each with its own
  certificate, long-polling (``--gateway-wait``) with nothing queued for ``--gateway-seconds``:
  ``gateway_presence_writes_per_s`` (transactions that wrote ``worker_presence``, recorded by a
  trigger), ``gateway_polls_per_s`` (answered long-polls), ``gateway_workers_live`` (what
  ``GET /v1/workers?liveness=live`` lists at the end) and ``gateway_db_transactions_per_s`` (every
  transaction of the database in the window, the long-polls' own work included).

Usage: ``.venv/bin/python bench/presence.py [--workers 1000,10000] [--rounds 10] [--seconds 6]
[--interval 1.0] [--database-url URL]``. It drops and recreates the database
``leasehold_presence_bench`` (``--database-name``) and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import aiohttp
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import recreate_database, resolve_server_url  # noqa: E402

from leasehold.cli.dev_ca import init_pki, issue_worker_certificate  # noqa: E402
from leasehold.gateway.background import presence as loop  # noqa: E402
from leasehold.gateway.keys import SERVICES  # noqa: E402
from leasehold.gateway.presence import Presence, Seen  # noqa: E402
from leasehold.gateway.serve import start  # noqa: E402
from leasehold.gateway.settings import GatewaySettings  # noqa: E402
from leasehold.migrations import runner as migrate  # noqa: E402
from leasehold.persistence import presence as stored  # noqa: E402
from leasehold.persistence.connection import connect, create_pool  # noqa: E402
from leasehold.persistence.transaction import Database  # noqa: E402
from leasehold.worker.client import client_ssl_context  # noqa: E402

ADMIN_KEY = "bench-admin-key-0123456789"


def register(url: str, n: int) -> list[UUID]:
    ids = sorted(uuid4() for _ in range(n))
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor().copy(
            "COPY workers (id, name, fingerprint, enabled, max_concurrent_tasks, capabilities, task_types, "
            "created_at, updated_at, version, head_hash) FROM STDIN") as copy:
        for i, worker_id in enumerate(ids):
            copy.write_row((worker_id, f"w{i}", f"{i:064x}", True, 4, [], ["probe"], "now", "now", 1, b"\0" * 32))
    return ids


async def wal_lsn(conn: Any) -> int:
    cur = await conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
    row = await cur.fetchone()
    return int(row[0])


async def measure(url: str, n: int, rounds: int, seconds: float, interval: float, polls_per_second: float,
                  pause: float = 0.0) -> dict[str, Any]:
    ids = register(url, n)
    presence = Presence()
    pool = create_pool(url, min_size=1, max_size=2)
    await pool.open()
    db = Database(pool)
    publish_ms, idle_ms, wal = [], [], []
    try:
        async with await connect(url) as probe:
            for _ in range(rounds + 1):  # the first inserts every row; the rounds after it update them
                for worker_id in ids:
                    presence.saw(worker_id, Seen.POLL)
                before = await wal_lsn(probe)
                started = time.perf_counter()
                assert await loop.publish(db, presence) == n
                publish_ms.append((time.perf_counter() - started) * 1000)
                wal.append(await wal_lsn(probe) - before)
                started = time.perf_counter()
                assert await loop.publish(db, presence) == 0
                idle_ms.append((time.perf_counter() - started) * 1000)
                await asyncio.sleep(pause)
            # As many publishes again on the probe, whose own statistics it can flush and read.
            stats = ("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'worker_presence'")
            await probe.execute("SELECT pg_stat_force_next_flush()")
            await probe.execute("SELECT pg_stat_clear_snapshot()")
            upd0, hot0 = await (await probe.execute(stats)).fetchone() or (0, 0)
            for _ in range(rounds):
                for worker_id in ids:
                    presence.saw(worker_id, Seen.POLL)
                published = presence.take()
                await stored.publish(probe, published.worker_ids, published.ages)
                await asyncio.sleep(pause)
            await probe.execute("SELECT pg_stat_force_next_flush()")
            await probe.execute("SELECT pg_stat_clear_snapshot()")
            upd1, hot1 = await (await probe.execute(stats)).fetchone() or (0, 0)
            hot = (hot1 - hot0) / (upd1 - upd0) if upd1 > upd0 else float("nan")

            statements = 0

            def counted(_: int) -> None:
                nonlocal statements
                statements += 1

            polls = 0

            async def poll() -> None:
                nonlocal polls
                while True:
                    for worker_id in ids:
                        presence.saw(worker_id, Seen.POLL)
                    polls += n
                    await asyncio.sleep(1 / polls_per_second)

            xact = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
            await probe.execute("SELECT pg_stat_force_next_flush()")
            before_x = (await (await probe.execute(xact)).fetchone() or (0,))[0]
            tasks = [asyncio.create_task(poll()), asyncio.create_task(loop.run(db, presence, interval,
                                                                                on_publish=counted))]
            started = time.perf_counter()
            await asyncio.sleep(seconds)  # the window measured
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            elapsed = time.perf_counter() - started
            await asyncio.sleep(1.1)  # let the server's statistics catch up (flushed at most once a second)
            await probe.execute("SELECT pg_stat_clear_snapshot()")
            after_x = (await (await probe.execute(xact)).fetchone() or (0,))[0]
    finally:
        await pool.close()
    return {"publish_ms": round(statistics.median(publish_ms[1:]), 2),
            "publish_first_ms": round(publish_ms[0], 2),
            "publish_idle_ms": round(statistics.median(idle_ms), 3),
            "hot_update_ratio": round(hot, 3),
            "wal_bytes_per_publish": int(statistics.median(wal[1:])),
            # The probe's own reads of the counter are 2 of these transactions.
            "loop_transactions_per_s": round(max(0, after_x - before_x - 2) / elapsed, 2),
            "loop_statements": statements, "loop_polls": polls, "loop_seconds": round(elapsed, 2)}


async def through_gateway(url: str, n: int, seconds: float, interval: float, wait: int) -> dict[str, Any]:
    """A real Gateway (in this process, TLS, mTLS) with ``n`` workers, each with its own
    certificate, long-polling with ``wait_seconds`` and no work queued, for ``seconds``: the
    transactions that wrote ``worker_presence`` (a statement-level trigger records each) against
    the polls, and how many workers the API then lists as live."""
    with tempfile.TemporaryDirectory() as tmp:
        pki = init_pki(Path(tmp) / "pki")
        settings = GatewaySettings(database_url=url, pki_dir=pki.directory, worker_port=0, operator_port=0,
                                   admin_api_key=ADMIN_KEY, presence_publish_seconds=interval,
                                   max_wait_seconds=max(wait, 1), log_level="WARNING")
        runner, (worker_port, operator_port) = await start(settings)
        sessions: list[aiohttp.ClientSession] = []
        try:
            services = runner.app[SERVICES]
            org = await services.registry.create_organization("bench")
            async with services.db.connection() as conn:
                await conn.execute("""
                    CREATE TABLE presence_writes (xid xid8 PRIMARY KEY);
                    CREATE FUNCTION record_presence_write() RETURNS trigger LANGUAGE plpgsql AS
                    $$ BEGIN INSERT INTO presence_writes VALUES (pg_current_xact_id()) ON CONFLICT DO NOTHING;
                             RETURN NULL; END $$;
                    CREATE TRIGGER record_presence_write AFTER INSERT OR UPDATE ON worker_presence
                    FOR EACH STATEMENT EXECUTE FUNCTION record_presence_write();""")
            for i in range(n):
                cert = issue_worker_certificate(pki.directory, f"bench-{i}")
                worker_id = await services.registry.register_worker(
                    name=f"bench-{i}", fingerprint=cert.fingerprint, task_types=("probe",), max_concurrent_tasks=1)
                await services.registry.assign_worker(worker_id, org)
                sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                    ssl=client_ssl_context(pki.ca_cert, cert.cert_path, cert.key_path), limit=1)))
            polls = 0
            acquire = f"https://localhost:{worker_port}/v1/tasks/acquire"

            async def long_poll(session: aiohttp.ClientSession) -> None:
                nonlocal polls
                while True:
                    async with session.post(acquire, json={"wait_seconds": wait}) as reply:
                        await reply.read()
                        assert reply.status == 204, reply.status
                    polls += 1

            tasks = [asyncio.create_task(long_poll(s)) for s in sessions]
            await asyncio.sleep(max(2 * interval, 1.0))  # every worker connected and published once
            xact = ("SELECT (SELECT count(*) FROM presence_writes), "
                    "(SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database())")
            async with services.db.connection() as conn:
                before, xact_before = await (await conn.execute(xact)).fetchone() or (0, 0)
            polls_before, started = polls, time.perf_counter()
            await asyncio.sleep(seconds)  # the window measured
            async with services.db.connection() as conn:
                after, xact_after = await (await conn.execute(xact)).fetchone() or (0, 0)
            elapsed = time.perf_counter() - started
            live = 0
            ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as operator:
                after_id = None
                while True:
                    query = {"liveness": "live", "limit": "500", **({"after": after_id} if after_id else {})}
                    async with operator.get(f"https://localhost:{operator_port}/v1/workers", params=query,
                                            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as reply:
                        page = await reply.json()
                    live += len(page["items"])
                    after_id = page["next_after"]
                    if after_id is None:
                        break
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for session in sessions:
                await session.close()
            await runner.cleanup()
    return {"gateway_presence_writes_per_s": round((after - before) / elapsed, 2),
            "gateway_polls_per_s": round((polls - polls_before) / elapsed, 1),
            "gateway_workers_live": live, "gateway_seconds": round(elapsed, 1),
            # Every transaction of the database (as its statistics had it; a backend reports them
            # within a second or so): the long-polls' own checks included, not only presence.
            "gateway_db_transactions_per_s": round((xact_after - xact_before) / elapsed, 1)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1000,10000", help="comma-separated worker counts")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seconds", type=float, default=6.0, help="length of the publish loop's window")
    p.add_argument("--interval", type=float, default=1.0, help="the loop's presence_publish_seconds")
    p.add_argument("--polls-per-second", type=float, default=1.0, help="how often each worker is seen in the window")
    p.add_argument("--pause", type=float, default=0.5, help="seconds between two measured publishes")
    p.add_argument("--gateway-workers", type=int, default=200,
                   help="workers long-polling a real Gateway, each with its own certificate (0: skip)")
    p.add_argument("--gateway-wait", type=int, default=20, help="their wait_seconds")
    p.add_argument("--gateway-seconds", type=float, default=30.0, help="length of the Gateway window")
    p.add_argument("--database-url", help="maintenance database URL of the server to use")
    p.add_argument("--database-name", default="leasehold_presence_bench")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server, source = resolve_server_url(args.database_url)
    print(f"server {source}")
    print(f"interval_s {args.interval}")
    for n in (int(x) for x in args.workers.split(",")):
        url = recreate_database(server, args.database_name)
        try:
            migrate.upgrade(url, "head")
            result = asyncio.run(measure(url, n, args.rounds, args.seconds, args.interval, args.polls_per_second,
                                         args.pause))
        finally:
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(args.database_name)))
        for name, value in result.items():
            print(f"{name}_at_{n} {value}")
    if args.gateway_workers > 0:
        n = args.gateway_workers
        url = recreate_database(server, args.database_name)
        try:
            migrate.upgrade(url, "head")
            result = asyncio.run(through_gateway(url, n, args.gateway_seconds, args.interval, args.gateway_wait))
        finally:
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(args.database_name)))
        for name, value in result.items():
            print(f"{name}_at_{n} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
