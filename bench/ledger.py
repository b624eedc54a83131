"""Write ledger: what each command of a task's lifecycle costs PostgreSQL, counted by the server.

Runs N lifecycles sequentially through the service layer (``gateway.commands.Lifecycle``, one
pooled connection, no HTTP): ``create_task -> acquire -> renew -> submit_batch (1 record) ->
complete (carrying the final 1-record batch)``, each on a one-job scan of its own created before
the measured part. After every command the command's own backend is made to flush its statistics
(``pg_stat_force_next_flush()``) and the ledger reads, on that same connection:

* ``pg_stat_statements`` (when the server preloads it): statements executed (as it counts them:
  the BEGIN and COMMIT psycopg sends are not among them, the commits are counted below), and
  with ``--statements`` the list of them, per command;
* ``pg_stat_user_tables`` deltas per table (partitions counted under their partitioned table):
  rows inserted, updated, HOT-updated;
* index entries written, per table: ``inserted x indexes + (updated - HOT-updated) x indexes``
  (an upper bound: a partial index whose predicate a row does not meet gets no entry);
* ``xact_commit`` of the database (commits), and the WAL written (``pg_current_wal_lsn()``).

The ledger's own reads (two statements after every command) are subtracted or filtered out.

Server: by default a PRIVATE PostgreSQL it starts itself (``leasehold db start``'s embedded server,
data directory ``--data-dir``, port ``--port``) with ``shared_preload_libraries =
pg_stat_statements`` and autovacuum off, so that the WAL and the statistics are the ledger's
alone; ``--database-url`` uses another server instead (then statements are counted only if that
server has pg_stat_statements). It drops and recreates the scratch database ``leasehold_ledger``
(``--scratch-prefix`` renames it), migrated to ``--revision`` (default head).

Usage: ``.venv/bin/python bench/ledger.py [--lifecycles 200] [--statements] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from common import recreate_database
from core_lifecycle import SPEC, make_loop, provision

from leasehold.cli.embedded import EmbeddedPostgres
from leasehold.domain.results import payload_sha256
from leasehold.gateway.commands.lifecycle import ResultBatch
from leasehold.gateway.services import build_services
from leasehold.migrations import runner as migrate
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database

LEDGER_DB = "leasehold_ledger"
COMMANDS = ("create_task", "acquire", "renew", "submit_batch", "complete")
#: The ledger's own statements run on the measured connection after each command (2 transactions).
PROBE_FLUSH = "SELECT pg_stat_force_next_flush() /* ledger probe */"
PROBE_READ = """
SELECT /* ledger probe */
    (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS commits,
    pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal,
    (SELECT coalesce(jsonb_object_agg(name, jsonb_build_array(ins, upd, hot)), '{}')
     FROM (SELECT coalesce(parent.relname, s.relname) AS name, sum(s.n_tup_ins) AS ins,
                  sum(s.n_tup_upd) AS upd, sum(s.n_tup_hot_upd) AS hot
           FROM pg_stat_user_tables s
           LEFT JOIN pg_inherits i ON i.inhrelid = s.relid
           LEFT JOIN pg_class parent ON parent.oid = i.inhparent
           GROUP BY 1) t) AS tables
"""
PROBE_STATEMENTS = """
SELECT /* ledger probe */ queryid::text, calls, query FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query NOT LIKE '%%ledger probe%%'
"""
#: Indexes per table (a partitioned table: those of one of its partitions, as each row is in one).
INDEX_COUNTS = """
SELECT coalesce(parent.relname, c.relname) AS name, max(n.indexes) AS indexes
FROM pg_class c
JOIN pg_namespace ns ON ns.oid = c.relnamespace AND ns.nspname = 'public'
LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
LEFT JOIN pg_class parent ON parent.oid = i.inhparent
CROSS JOIN LATERAL (SELECT count(*) AS indexes FROM pg_index x WHERE x.indrelid = c.oid) n
WHERE c.relkind = 'r'
GROUP BY 1
"""


def log(message: str) -> None:
    print(f"[ledger {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def private_server(data_dir: Path, port: int) -> str:
    """Start (initdb first if needed) the embedded server in ``data_dir`` on ``port`` with
    pg_stat_statements preloaded and autovacuum off; its maintenance URL."""
    server = EmbeddedPostgres(data_dir)
    server.start()
    wanted = {"shared_preload_libraries": "pg_stat_statements", "autovacuum": "off"}
    with psycopg.connect(server.url(), autocommit=True) as conn:
        current = {k: str(conn.execute(f"SHOW {k}").fetchone()[0]) for k in wanted}  # type: ignore[index]
        for k, v in wanted.items():
            conn.execute(f"ALTER SYSTEM SET {k} = '{v}'")
    if current != wanted or server.port != port:
        log(f"restarting the private server on port {port} with {wanted}")
        server.stop()
        (server.data_dir / "leasehold.port").write_text(f"{port}\n")
        server.start()
    return server.url()


@dataclass
class Snapshot:
    commits: int
    wal: int
    tables: dict[str, tuple[int, int, int]]
    statements: dict[str, tuple[int, str]]


@dataclass
class Ledger:
    indexes: dict[str, int]
    lifecycles: int = 0
    commits: Counter[str] = field(default_factory=Counter)
    wal: Counter[str] = field(default_factory=Counter)
    tables: dict[str, dict[str, Counter[str]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(Counter)))
    statements: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    texts: dict[str, str] = field(default_factory=dict)
    has_statements: bool = False

    def add(self, command: str, before: Snapshot, after: Snapshot, probes: int) -> None:
        self.commits[command] += after.commits - before.commits - probes
        self.wal[command] += after.wal - before.wal
        for name, (ins, upd, hot) in after.tables.items():
            b_ins, b_upd, b_hot = before.tables.get(name, (0, 0, 0))
            row = self.tables[command][name]
            row["inserted"] += ins - b_ins
            row["updated"] += upd - b_upd
            row["hot"] += hot - b_hot
        for qid, (calls, text) in after.statements.items():
            delta = calls - before.statements.get(qid, (0, ""))[0]
            if delta:
                self.statements[command][qid] += delta
                self.texts[qid] = text

    def command_summary(self, command: str) -> dict[str, Any]:
        n = max(self.lifecycles, 1)
        per_table: dict[str, dict[str, float]] = {}
        totals: Counter[str] = Counter()
        for name, row in sorted(self.tables[command].items()):
            if not any(row.values()):
                continue
            entries = (row["inserted"] + row["updated"] - row["hot"]) * self.indexes.get(name, 0)
            per_table[name] = {"inserted": round(row["inserted"] / n, 2), "updated": round(row["updated"] / n, 2),
                               "hot": round(row["hot"] / n, 2), "index_entries": round(entries / n, 2)}
            totals.update({**row, "index_entries": entries})
        out: dict[str, Any] = {
            "statements": round(sum(self.statements[command].values()) / n, 2) if self.has_statements else None,
            "commits": round(self.commits[command] / n, 2),
            "rows_inserted": round(totals["inserted"] / n, 2),
            "rows_updated": round(totals["updated"] / n, 2),
            "hot_updated": round(totals["hot"] / n, 2),
            "index_entries": round(totals["index_entries"] / n, 2),
            "wal_bytes": round(self.wal[command] / n),
            "tables": per_table,
        }
        if self.has_statements:
            out["statement_list"] = [
                {"calls": round(c / n, 2), "query": " ".join(self.texts[q].split())}
                for q, c in self.statements[command].most_common()]
        return out


async def snapshot(conn: psycopg.AsyncConnection[Any], with_statements: bool) -> Snapshot:
    await conn.execute(PROBE_FLUSH)  # flushed before the server answers: the next read sees it all
    cur = await conn.execute(PROBE_READ)
    row = await cur.fetchone()
    assert row is not None
    statements: dict[str, tuple[int, str]] = {}
    if with_statements:
        cur = await conn.execute(PROBE_STATEMENTS)
        statements = {qid: (int(calls), text) for qid, calls, text in await cur.fetchall()}
    tables = {k: (int(v[0]), int(v[1]), int(v[2])) for k, v in row[2].items()}
    return Snapshot(int(row[0]), int(row[1]), tables, statements)


async def run_ledger(url: str, lifecycles: int, warmup: int) -> Ledger:
    pool = create_pool(url, min_size=1, max_size=1)
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'")
            has_statements = bool((await cur.fetchone())[0])  # type: ignore[index]
            cur = await conn.execute(INDEX_COUNTS)
            indexes = {name: int(n) for name, n in await cur.fetchall()}
        services = build_services(Database(pool))
        loop = await make_loop(services.registry, f"ledger-{secrets.token_hex(4)}")
        await provision(services.scans, loop, warmup + lifecycles)
        ledger = Ledger(indexes=indexes, has_statements=has_statements)
        lifecycle = services.lifecycle
        for i in range(warmup + lifecycles):
            measured = i >= warmup
            marks: dict[str, Snapshot] = {}

            async def mark(command: str, *, measured: bool = measured, marks: dict[str, Snapshot] = marks) -> None:
                if not measured:
                    return
                async with pool.connection() as conn:
                    snap = await snapshot(conn, has_statements)
                if command != "start":
                    ledger.add(command, marks["last"], snap, probes=3 if has_statements else 2)
                marks["last"] = snap

            await mark("start")
            task = await lifecycle.create_task(loop.scans.popleft(), SPEC)
            await mark("create_task")
            acquired = await lifecycle.acquire(loop.worker)
            assert acquired is not None and acquired.task.id == task.id, "the loop's own task"
            await mark("acquire")
            args = (loop.worker, acquired.task.id, acquired.attempt.id, acquired.lease_token)
            await lifecycle.renew(*args)
            await mark("renew")
            records = [{"type": "asset", "kind": "host", "value": f"{task.id}.a.ledger.example.test"}]
            await lifecycle.submit_batch(*args, sequence_number=1, idempotency_key="first",
                                         payload_sha256=payload_sha256(records), records=records, final=False)
            await mark("submit_batch")
            records = [{"type": "asset", "kind": "host", "value": f"{task.id}.b.ledger.example.test"}]
            await lifecycle.complete(*args, final_batch=ResultBatch(2, "final", payload_sha256(records), records))
            await mark("complete")
            if measured:
                ledger.lifecycles += 1
        return ledger
    finally:
        await pool.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lifecycles", type=int, default=200, help="measured lifecycles (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="unmeasured lifecycles first (default 20)")
    p.add_argument("--revision", default="head",
                   help="migrate the scratch database to this revision (the statements of this checkout must suit it)")
    p.add_argument("--database-url", help="use this server (maintenance database URL) instead of a private one")
    p.add_argument("--data-dir", default="/tmp/pg-ledger", help="the private server's data directory")
    p.add_argument("--port", type=int, default=5532, help="the private server's port")
    p.add_argument("--scratch-prefix", default="", help="prefix of the scratch database's name")
    p.add_argument("--statements", action="store_true", help="print every statement per command")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server_url = args.database_url or private_server(Path(args.data_dir), args.port)
    name = f"{args.scratch_prefix}{LEDGER_DB}"
    url = recreate_database(server_url, name)
    migrate.upgrade(url, args.revision)
    with psycopg.connect(url, autocommit=True) as conn:
        preload = str(conn.execute("SHOW shared_preload_libraries").fetchone()[0])  # type: ignore[index]
        if "pg_stat_statements" in preload:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
        else:
            log("the server does not preload pg_stat_statements: statements are not counted")
        conn.execute("VACUUM ANALYZE")
        revision = migrate.current(url)
        version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
    log(f"server {version}, database {name} at revision {revision}")
    ledger = asyncio.run(run_ledger(url, args.lifecycles, args.warmup))
    commands = {c: ledger.command_summary(c) for c in COMMANDS}
    total = {k: round(sum(s[k] for s in commands.values()), 2) if ledger.has_statements or k != "statements"
             else None for k in ("statements", "commits", "rows_inserted", "rows_updated", "hot_updated",
                                 "index_entries", "wal_bytes")}
    result = {"revision": revision, "server_version": version, "lifecycles": ledger.lifecycles,
              "load_average": os.getloadavg()[0], "indexes": ledger.indexes, "commands": commands, "total": total}
    if args.json:
        print(json.dumps(result))
        return 0
    keys = ("statements", "commits", "rows_inserted", "rows_updated", "hot_updated", "index_entries", "wal_bytes")
    print(f"ledger revision={revision} server={version} lifecycles={ledger.lifecycles} "
          f"load_average={result['load_average']:.2f}")
    for command, s in [*commands.items(), ("lifecycle", total)]:
        print(f"ledger_command command={command} " + " ".join(f"{k}={s[k]}" for k in keys))
    for command, s in commands.items():
        for table, t in s["tables"].items():
            print(f"ledger_table command={command} table={table} indexes={ledger.indexes.get(table, 0)} "
                  + " ".join(f"{k}={v}" for k, v in t.items()))
    if args.statements:
        for command, s in commands.items():
            for st in s.get("statement_list", []):
                print(f"ledger_statement command={command} calls={st['calls']} query={st['query']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
