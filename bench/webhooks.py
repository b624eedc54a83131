"""Webhook delivery throughput: N notifications in the outbox, sent by the Gateway's sender
(``gateway.background.webhooks.Sender``) to a local receiver that verifies each signature with
the guide's snippet and answers 204. Rounds alternate the sender's batch size (``--batches``), so
they compare within one run. Prints plain ``name value`` lines, asserts nothing.

* ``notifications``: N outbox rows per round (``--notifications``), queued by :func:`notify` in
  transactions of 100;
* ``enqueue_per_s``: notifications queued per second (the outbox's insert, in its transaction);
* ``batch_<B>_delivered_per_s``: deliveries recorded per second with batch size B, median of the
  rounds (``--rounds`` per batch size), receiver and sender in this one process;
* ``received_twice``: notifications the receiver got more than once (0 without faults);
* ``load_avg_1m``.

Usage: ``.venv/bin/python bench/webhooks.py [--notifications 2000] [--batches 20,100] [--rounds 2]
[--database-url URL]``. It drops and recreates ``leasehold_webhooks_bench`` (``--database-name``)
and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from common import recreate_database, resolve_server_url  # noqa: E402

from leasehold.domain.retry import RetryPolicy  # noqa: E402
from leasehold.gateway.background import webhooks as sender_loop  # noqa: E402
from leasehold.gateway.commands.webhooks import notify  # noqa: E402
from leasehold.gateway.services import build_services  # noqa: E402
from leasehold.migrations import runner as migrate  # noqa: E402
from leasehold.persistence.connection import create_pool  # noqa: E402
from leasehold.persistence.transaction import Database  # noqa: E402
from support.webhook_receiver import Receiver  # noqa: E402


async def pending(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM webhook_deliveries WHERE delivered_at IS NULL")
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def main(args: argparse.Namespace) -> None:
    server_url, source = resolve_server_url(args.database_url)
    url = recreate_database(server_url, args.database_name)
    print(f"# server: {source}", flush=True)
    try:
        migrate.upgrade(url)
        pool = create_pool(url, min_size=2, max_size=8)
        await pool.open()
        receiver = Receiver()
        await receiver.up()
        try:
            services = build_services(Database(pool))
            org = await services.registry.create_organization("webhooks-bench")
            _, secret = await services.webhooks.create(org, receiver.url(), event_types=["scan.finished"],
                                                       description=None, actor="bench")
            receiver.secrets["hook"] = secret
            rates: dict[int, list[float]] = {b: [] for b in args.batches}
            queued_rates: list[float] = []
            async with sender_loop.session() as session:
                for _ in range(args.rounds):
                    for batch in args.batches:
                        began = time.perf_counter()
                        for start in range(0, args.notifications, 100):
                            async with services.db.transaction() as tx:
                                for n in range(start, min(start + 100, args.notifications)):
                                    notify(tx, org, "scan.finished", {"n": n}, None)
                                await tx.commit()
                        queued_rates.append(args.notifications / (time.perf_counter() - began))
                        sender = sender_loop.Sender(services.webhooks, session, timeout=10, max_attempts=5,
                                                    backoff=RetryPolicy(base_seconds=1), batch=batch)
                        began = time.perf_counter()
                        sent = await sender.send_due(budget=float("inf"))
                        elapsed = time.perf_counter() - began
                        assert sent == args.notifications and await pending(url) == 0, sent
                        rates[batch].append(args.notifications / elapsed)
                        print(f"# round batch={batch}: {args.notifications / elapsed:.0f}/s", flush=True)
        finally:
            await receiver.down()
            await pool.close()
        print(f"notifications {args.notifications}")
        print(f"enqueue_per_s {statistics.median(queued_rates):.0f}")
        for batch, found in rates.items():
            print(f"batch_{batch}_delivered_per_s {statistics.median(found):.0f}")
        print(f"received_twice {sum(1 for c in receiver.received.values() if c > 1)}")
        print(f"refused {len(receiver.refused)}")
        print(f"load_avg_1m {os.getloadavg()[0]:.2f}")
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.database_name)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notifications", type=int, default=2000)
    parser.add_argument("--batches", type=lambda v: [int(b) for b in v.split(",")], default=[20, 100],
                        help="the sender's batch sizes to alternate, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per batch size")
    parser.add_argument("--database-url")
    parser.add_argument("--database-name", default="leasehold_webhooks_bench")
    asyncio.run(main(parser.parse_args()))
