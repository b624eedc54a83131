"""Scale benchmark: the hot path with a big, partitioned event log, and archive throughput.

Prints numbers, asserts nothing. On the scratch database ``leasehold_scale`` (dropped and
recreated), whose log is laid out as 12 monthly partitions (the 11 months before the current
one and the current one) plus the partitions the Gateway would create ahead:

1. ``empty``: acquire latency (one worker, sequential, timing only ``acquire``: the core
   benchmark's ``acquire_latencies``) and command cost per lifecycle (create_task -> acquire ->
   complete with a final batch, sequential on one connection, through the core benchmark's
   protocol relay: round trips and the backend's CPU per command, ``measure_cost``).
2. ``fill``: N events spread evenly over the 12 partitions by ``COPY`` (hash-chained streams of
   seven events copied from a real lifecycle's events, so they decode and verify like real
   ones), then ``VACUUM ANALYZE``.
3. ``loaded``: the same measurements again; the ratios loaded/empty are printed against the
   1.2x goal.
4. ``archive``: ``retention``'s ``archive_partition`` on the oldest filled partition (export,
   verify from disk, detach and drop): events/s for the whole and for each step.

Only the event log is filled: projections (tasks, attempts, batches) are the core benchmark's
``history`` section. A big fill belongs on a private server (``--database-url`` of one started
with ``initdb``/``pg_ctl``): the shared one would be loaded for minutes.

Usage: ``.venv/bin/python bench/scale.py [--events 10000000] [--acquires 500] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import secrets
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the project's replay package, not bench/replay.py

import core_lifecycle as core  # noqa: E402
from common import recreate_database, resolve_server_url  # noqa: E402

from leasehold.cli.embedded import redact_url  # noqa: E402
from leasehold.gateway.services import build_services  # noqa: E402
from leasehold.migrations import runner as migrate  # noqa: E402
from leasehold.persistence.chain import GENESIS, chain_hash  # noqa: E402
from leasehold.persistence.connection import create_pool  # noqa: E402
from leasehold.persistence.partitions import list_partitions  # noqa: E402
from leasehold.persistence.seals import generate_keypair, load_private_key  # noqa: E402
from leasehold.persistence.transaction import Database  # noqa: E402
from leasehold.replay.retention import archive_partition  # noqa: E402

SCALE_DB = "leasehold_scale"
PARTITIONS = 12
GOAL = 1.2


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def lay_out_partitions(url: str) -> datetime:
    """A fresh database's log as 12 monthly partitions ending with the current month (plus the
    ones ahead): the first partition, still empty, is narrowed to end where they begin."""
    with psycopg.connect(url, autocommit=True) as conn:
        count = conn.execute("SELECT count(*) FROM events").fetchone()
        assert count == (0,), "a fresh database has no events"
        row = conn.execute("SELECT date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
                           " - make_interval(months => %s)", (PARTITIONS - 1,)).fetchone()
        assert row is not None
        start: datetime = row[0]
        with conn.transaction():
            conn.execute("ALTER TABLE events DETACH PARTITION events_p_initial")
            conn.execute(sql.SQL("ALTER TABLE events ATTACH PARTITION events_p_initial FOR VALUES FROM (MINVALUE)"
                                 " TO ({})").format(sql.Literal(start)))
        conn.execute("SELECT events_ensure_partitions('1 month', '2 months')")
    return start


async def template_stream(url: str) -> list[tuple[str, bytes]]:
    """(topic, state) of a real task's events, without its ResultBatchAccepted (copies would
    share its batch id), from one lifecycle run in the database."""
    pool = create_pool(url, min_size=1, max_size=1)
    await pool.open(wait=True)
    try:
        services = build_services(Database(pool))
        loop = await core.make_loop(services.registry, f"scale-template-{secrets.token_hex(4)}")
        await core.provision(services.scans, loop, 1)
        await core.one_lifecycle(services.lifecycle, services.scans, loop, None)
    finally:
        await pool.close()
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT topic, state FROM events WHERE originator_id = (SELECT originator_id FROM events"
            " WHERE topic LIKE '%:TaskCreated' ORDER BY notification_id DESC LIMIT 1) ORDER BY originator_version"
        ).fetchall()
    out = [(t, bytes(s)) for t, s in rows if not t.endswith(":ResultBatchAccepted")]
    while len(out) < 7:  # stream length: pad with renewals of the lease if the shape is shorter
        out.insert(-1, out[-2])
    return out[:7]


def fill(url: str, events: int, start: datetime, template: list[tuple[str, bytes]]) -> dict[str, Any]:
    """``events`` events (streams of len(template)) over the 12 months from ``start`` by COPY."""
    per_stream = len(template)
    streams = max(1, events // per_stream)
    months = [start + timedelta(days=31 * i) for i in range(PARTITIONS)]
    bounds = [datetime(m.year, m.month, 1, tzinfo=UTC) for m in months] + [
        datetime(months[-1].year + (months[-1].month == 12), months[-1].month % 12 + 1, 1, tzinfo=UTC)]
    now = datetime.now(UTC)
    started = time.perf_counter()
    written = 0
    chunk = 20_000  # streams per COPY
    with psycopg.connect(url) as conn:
        for first in range(0, streams, chunk):
            buf = io.StringIO()
            for s in range(first, min(streams, first + chunk)):
                p = s * PARTITIONS // streams
                lo, hi = bounds[p], min(bounds[p + 1], now - timedelta(minutes=5))
                at = lo + (hi - lo) * ((s * 7919) % 1000 / 1000)
                oid = uuid.uuid4()
                prev = GENESIS
                for version, (topic, state) in enumerate(template, 1):
                    h = chain_hash(prev, oid, version, topic, state)
                    buf.write(f"{oid}\t{version}\t{topic}\t\\\\x{state.hex()}\t{at.isoformat()}\t"
                              f"\\\\x{prev.hex()}\t\\\\x{h.hex()}\n")
                    prev = h
                    written += 1
            with conn.cursor().copy("COPY events (originator_id, originator_version, topic, state, recorded_at,"
                                    " prev_hash, hash) FROM STDIN") as copy:
                copy.write(buf.getvalue())
            conn.commit()
            if first // chunk % 10 == 0:
                log(f"fill: {written:,} events ({written / (time.perf_counter() - started):,.0f}/s)")
    seconds = time.perf_counter() - started
    return {"events": written, "streams": streams, "seconds": round(seconds, 1),
            "events_per_s": round(written / seconds)}


def partition_sizes(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tableoid::regclass::text, count(*) FROM events GROUP BY 1 ORDER BY 1").fetchall()
    return {r[0]: r[1] for r in rows}


async def measure(server_url: str, url: str, acquires: int, cost_lifecycles: int) -> dict[str, Any]:
    pool = create_pool(url, min_size=1, max_size=1)
    await pool.open(wait=True)
    try:
        services = build_services(Database(pool))
        loop = await core.make_loop(services.registry, f"scale-{secrets.token_hex(4)}")
        acquire = await core.acquire_latencies(services.scans, services.lifecycle, loop, acquires, url, True)
    finally:
        await pool.close()
    cost = await core.measure_cost(server_url, url, cost_lifecycles)
    return {"load_average": round(os.getloadavg()[0], 1),
            "acquire": {k: acquire[k] for k in ("p50_ms", "p99_ms", "mean_ms", "n", "backend_cpu_ms")},
            "cost": {"backend_cpu_ms": cost["backend_cpu_ms"], "wire": cost["wire"],
                     "per_command_backend_cpu_ms": {k: v["backend_cpu_ms"] for k, v in cost["per_command"].items()}}}


async def archive_oldest(url: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="leasehold-scale-") as tmp:
        key_path, pub_path = Path(tmp) / "key.pem", Path(tmp) / "pub.pem"
        generate_keypair(key_path, pub_path)
        key = load_private_key(key_path)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            filled = [p for p in await list_partitions(conn) if not p.is_default and p.lower_bound is not None]
            oldest = filled[0]
            started = time.perf_counter()
            done = await archive_partition(conn, oldest, Path(tmp) / oldest.name, key)
            seconds = time.perf_counter() - started
        size = sum(f.stat().st_size for f in (Path(tmp) / oldest.name).iterdir())
    events = done.record.events
    return {"partition": oldest.name, "events": events, "seconds": round(seconds, 2),
            "export_s": round(done.export_seconds, 2), "verify_s": round(done.verify_seconds, 2),
            "drop_s": round(done.drop_seconds, 3),
            "events_per_s": round(events / seconds) if seconds else None, "archive_bytes": size}


def ratio(loaded: float | None, empty: float | None) -> float | None:
    return round(loaded / empty, 3) if loaded is not None and empty else None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server_url, origin = resolve_server_url(args.database_url)
    log(f"server: {redact_url(server_url)} ({origin})")
    core.BENCH_DB = args.database_name  # measure_cost reads the counters of this database
    url = recreate_database(server_url, args.database_name)
    migrate.upgrade(url, "head")
    start = lay_out_partitions(url)
    out: dict[str, Any] = {"server": redact_url(server_url), "events_goal": args.events}
    template = await template_stream(url)
    await asyncio.to_thread(core.vacuum_analyze, url)
    log("empty: measuring")
    out["empty"] = await measure(server_url, url, args.acquires, args.cost_lifecycles)
    log(f"fill: {args.events:,} events over {PARTITIONS} partitions")
    out["fill"] = await asyncio.to_thread(fill, url, args.events, start, template)
    out["vacuum_analyze_s"] = round(await asyncio.to_thread(core.vacuum_analyze, url), 1)
    out["partitions"] = partition_sizes(url)
    log("loaded: measuring")
    out["loaded"] = await measure(server_url, url, args.acquires, args.cost_lifecycles)
    e, h = out["empty"], out["loaded"]
    out["ratios"] = {
        "acquire_p50": ratio(h["acquire"]["p50_ms"], e["acquire"]["p50_ms"]),
        "acquire_mean": ratio(h["acquire"]["mean_ms"], e["acquire"]["mean_ms"]),
        "acquire_backend_cpu": ratio(h["acquire"]["backend_cpu_ms"], e["acquire"]["backend_cpu_ms"]),
        "lifecycle_backend_cpu": ratio(h["cost"]["backend_cpu_ms"], e["cost"]["backend_cpu_ms"]),
        "lifecycle_round_trips": ratio(h["cost"]["wire"].get("round_trips"), e["cost"]["wire"].get("round_trips")),
    }
    log("archive: the oldest partition")
    out["archive"] = await archive_oldest(url)
    if not args.keep:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.database_name)))
    return out


def print_lines(out: dict[str, Any]) -> None:
    f = out["fill"]
    print(f"scale_events {f['events']}")
    print(f"scale_partitions_filled {sum(1 for n, c in out['partitions'].items() if c and n != 'events_p_default')}")
    print(f"scale_fill_events_per_s {f['events_per_s']}")
    for state in ("empty", "loaded"):
        a, c = out[state]["acquire"], out[state]["cost"]
        print(f"scale_{state}_acquire_p50_ms {a['p50_ms']}")
        print(f"scale_{state}_acquire_p99_ms {a['p99_ms']}")
        print(f"scale_{state}_acquire_mean_ms {a['mean_ms']}")
        print(f"scale_{state}_acquire_backend_cpu_ms {a['backend_cpu_ms']}")
        print(f"scale_{state}_load_average {out[state]['load_average']}")
        print(f"scale_{state}_lifecycle_backend_cpu_ms {c['backend_cpu_ms']}")
        print(f"scale_{state}_lifecycle_round_trips {c['wire'].get('round_trips')}")
    for name, value in out["ratios"].items():
        verdict = "n/a" if value is None else ("within" if value <= GOAL else "ABOVE")
        print(f"scale_ratio_{name} {value} ({verdict} the {GOAL}x goal)")
    a = out["archive"]
    print(f"scale_archive_events {a['events']}")
    print(f"scale_archive_seconds {a['seconds']}")
    print(f"scale_archive_events_per_s {a['events_per_s']}")
    print(f"scale_archive_export_s {a['export_s']}")
    print(f"scale_archive_verify_s {a['verify_s']}")
    print(f"scale_archive_drop_s {a['drop_s']}")
    print(f"scale_archive_bytes {a['archive_bytes']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--database-url", help="maintenance-database URL of the server (default: $BENCH_DATABASE_URL,"
                                          " else the machine's server, else the embedded one)")
    p.add_argument("--database-name", default=SCALE_DB, help=f"scratch database to recreate (default {SCALE_DB})")
    p.add_argument("--events", type=int, default=10_000_000, help="events to fill (default 10,000,000)")
    p.add_argument("--acquires", type=int, default=500, help="timed acquires per state (default 500)")
    p.add_argument("--cost-lifecycles", type=int, default=200, help="lifecycles counted on the wire (default 200)")
    p.add_argument("--warmup", type=int, default=core.ACQUIRE_WARMUP,
                   help=f"untimed acquires before the timed ones (default {core.ACQUIRE_WARMUP})")
    p.add_argument("--keep", action="store_true", help="keep the scratch database")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    core.ACQUIRE_WARMUP = args.warmup
    os.environ.setdefault(core.STEP_BY_STEP_ENV, "0")
    out = asyncio.run(run(args))
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        print_lines(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

