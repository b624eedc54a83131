"""Seal benchmark: what a signed seal costs at N streams (``persistence.seals.Sealer.seal``).

Prints plain ``name value`` lines, asserts nothing. For each N in ``--streams`` it loads N streams
of one correctly hashed event each (COPY, into a scratch database migrated to head), then times:

* ``seal_first_ms``: the first seal, which seals every head (the cost once, at switch-on);
* ``seal_changed_ms``: a seal after ``--changed`` streams got one more event each (the steady state
  of a busy Gateway: the cost follows what changed, not N), median of ``--rounds``;
* ``seal_idle_ms``: a seal with nothing new (what the loop costs every interval when quiet), median;
* ``sign_us``: the Ed25519 signature of one record alone;
* ``sign_event_head_us``: an Ed25519 signature of one 32-byte event hash: what signing every
  event's head on the write path would add per event (not done: see docs/guides/audit/seals.md);
* ``verify_digests_ms``: ``verify-chain --digests``' extra work (folding the digests and holding
  the log against them), once at the end.

Usage: ``.venv/bin/python bench/seal.py [--streams 1000,10000,100000] [--changed 100] [--rounds 20]
[--database-url URL]``. It drops and recreates the database ``leasehold_seal_bench``
(``--database-name``) on the server (as ``bench/replay.py`` chooses it) and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import recreate_database, resolve_server_url  # noqa: E402

from leasehold.migrations import runner as migrate  # noqa: E402
from leasehold.persistence.chain import GENESIS, chain_hash  # noqa: E402
from leasehold.persistence.checkpoints import verify_checkpoints  # noqa: E402
from leasehold.persistence.connection import connect  # noqa: E402
from leasehold.persistence.seals import (  # noqa: E402
    DirectorySink,
    Sealer,
    generate_keypair,
    load_private_key,
    load_public_key,
    record_of,
    sign_record,
)
from leasehold.persistence.snapshot import snapshot  # noqa: E402
from leasehold.replay.digests import load_digests, log_against_digests  # noqa: E402

TOPIC = "bench:Event"
STATE = b'{"n":1}'


def load_streams(url: str, heads: dict[UUID, tuple[int, bytes]], new: int) -> None:
    """``new`` fresh streams of one event each (into ``heads``)."""
    with psycopg.connect(url) as conn, conn.cursor() as cur, cur.copy(
            "COPY events (originator_id, originator_version, topic, state, prev_hash, hash) FROM STDIN") as copy:
        for _ in range(new):
            oid = uuid4()
            h = chain_hash(GENESIS, oid, 1, TOPIC, STATE)
            copy.write_row((oid, 1, TOPIC, STATE, GENESIS, h))
            heads[oid] = (1, h)


def extend(url: str, heads: dict[UUID, tuple[int, bytes]], streams: list[UUID]) -> None:
    with psycopg.connect(url) as conn, conn.cursor() as cur, cur.copy(
            "COPY events (originator_id, originator_version, topic, state, prev_hash, hash) FROM STDIN") as copy:
        for oid in streams:
            version, prev = heads[oid]
            h = chain_hash(prev, oid, version + 1, TOPIC, STATE)
            copy.write_row((oid, version + 1, TOPIC, STATE, prev, h))
            heads[oid] = (version + 1, h)


async def timed_seal(conn: Any, sealer: Sealer) -> float:
    """One seal on a connection kept open, as the Gateway's pooled ones are."""
    started = time.perf_counter()
    await sealer.seal(conn)
    return (time.perf_counter() - started) * 1000


async def measure(url: str, n: int, changed: int, rounds: int, tmp: Path) -> dict[str, Any]:
    key_path, public_path = tmp / f"k{n}.pem", tmp / f"p{n}.pem"
    generate_keypair(key_path, public_path)
    sealer = Sealer(load_private_key(key_path), DirectorySink(tmp / f"digests-{n}"))
    heads: dict[UUID, tuple[int, bytes]] = {}
    load_streams(url, heads, n)
    with psycopg.connect(url, autocommit=True) as conn:  # as autovacuum would after a bulk load
        conn.execute("ANALYZE events")
    ids = list(heads)
    changed_ms, idle_ms = [], []
    async with await connect(url) as conn:
        first = await timed_seal(conn, sealer)
        for r in range(rounds):
            extend(url, heads, ids[(r * changed) % n:][:changed])
            changed_ms.append(await timed_seal(conn, sealer))
            idle_ms.append(await timed_seal(conn, sealer))
    record = record_of(*_fake_checkpoint(changed))
    started = time.perf_counter()
    for _ in range(200):
        sign_record(record, sealer.key)
    sign_us = (time.perf_counter() - started) / 200 * 1e6
    head = bytes(32)
    started = time.perf_counter()
    for _ in range(2000):
        sealer.key.sign(head)
    sign_head_us = (time.perf_counter() - started) / 2000 * 1e6
    started = time.perf_counter()
    digests = load_digests(tmp / f"digests-{n}", load_public_key(public_path))
    async with await connect(url) as conn, snapshot(conn):
        checkpoints, _ = await verify_checkpoints(conn)
        problems, unsealed = await log_against_digests(conn, digests, checkpoints)
    verify_ms = (time.perf_counter() - started) * 1000
    return {"streams": n, "seal_first_ms": round(first, 1), "seal_changed_ms": round(statistics.median(changed_ms), 2),
            "seal_idle_ms": round(statistics.median(idle_ms), 2), "sign_us": round(sign_us, 1),
            "sign_event_head_us": round(sign_head_us, 1),
            "verify_digests_ms": round(verify_ms, 1), "verify_digest_problems": len(problems) + len(digests.problems),
            "unsealed_events": unsealed.events}


def _fake_checkpoint(changed: int) -> tuple[Any, ...]:
    from datetime import UTC, datetime

    from leasehold.persistence.checkpoints import Checkpoint, Head

    cp = Checkpoint(1, datetime.now(UTC), 1, changed, changed, changed, bytes(32), bytes(32))
    return cp, [Head(uuid4(), 1, bytes(32)) for _ in range(changed)], 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", default="1000,10000,100000", help="comma-separated stream counts")
    p.add_argument("--changed", type=int, default=100, help="streams changed between two steady seals")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--database-url", help="maintenance database URL of the server to use")
    p.add_argument("--database-name", default="leasehold_seal_bench")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server, source = resolve_server_url(args.database_url)
    print(f"server {source}")
    print(f"changed_per_seal {args.changed}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.streams.split(",")):
            url = recreate_database(server, args.database_name)
            try:
                migrate.upgrade(url, "head")
                result = asyncio.run(measure(url, n, min(args.changed, n), args.rounds, Path(tmp)))
            finally:
                with psycopg.connect(server, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(args.database_name)))
            for name, value in result.items():
                if name != "streams":
                    print(f"{name}_at_{n} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
