"""How long a page of the operator lists takes as the history grows.

Grows a scratch database (migrated) in steps to ``--sizes`` tasks (one scan per two tasks, spread
over ``--orgs`` organisations, a mix of states and task types, over months of creation times),
and after each step times every list the operator API runs — ``scans_page`` and ``tasks_page``
with each filter, a first page and a page deep in the list (after a cursor), ``task_queues`` —
exactly as the Gateway runs them (read-only snapshot, custom plans). Prints, per size and query,
the median and p95 milliseconds over ``--runs`` runs and the rows the plan read from ``scans``,
``worker_tasks`` and ``worker_task_attempts``,
then each query's ratio of median times, largest size to smallest: a page whose cost does not grow
with the history keeps that ratio near 1.

    .venv/bin/python bench/finding_work.py [--sizes 10000,100000] [--runs 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import orjson
import psycopg
from psycopg import sql

from leasehold.persistence.queries import QUERIES

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STATES = ("completed", "completed", "completed", "failed_terminal", "cancelled", "pending", "running")
TASKS_PER_SCAN = 2


def grow(conn: psycopg.Connection[Any], *, scans: int, orgs: list[UUID], worker: UUID, start: int = 0) -> None:
    """Scans ``start+1 .. start+scans`` (17 minutes apart) with TASKS_PER_SCAN jobs, tasks and
    attempts each, over ``orgs``; states, statuses and task types cycle. No ANALYZE."""
    conn.execute("""
        INSERT INTO scans (id, organization_id, status, execution_mode, targets, created_at, updated_at, version,
                           head_hash)
        SELECT gen_random_uuid(), (%(orgs)s::uuid[])[1 + g %% %(n_orgs)s],
               (ARRAY['success', 'failed', 'running', 'cancelled'])[1 + g %% 4], 'gateway', '{}',
               %(t0)s + g * interval '17 minutes', now(), 2, '\\x00'
        FROM generate_series(%(first)s::int, %(last)s::int) g""",
                 {"orgs": orgs, "n_orgs": len(orgs), "t0": T0, "first": start + 1, "last": start + scans})
    conn.execute("""
        INSERT INTO scan_jobs (id, scan_id, organization_id, position, plugin, status, execution_mode,
                               created_at, updated_at)
        SELECT gen_random_uuid(), s.id, s.organization_id, p, 'probe', 'success', 'gateway', s.created_at, now()
        FROM scans s, generate_series(0, %(per)s::int - 1) p
        WHERE NOT EXISTS (SELECT 1 FROM scan_jobs j WHERE j.scan_id = s.id)""", {"per": TASKS_PER_SCAN})
    conn.execute("""
        INSERT INTO worker_tasks (id, scan_job_id, scan_id, organization_id, task_type, required_capabilities,
                                  priority, scope, parameters, state, available_at, attempt_count, max_attempts,
                                  lease_seconds, execution_timeout_seconds, created_at, updated_at, version,
                                  head_hash)
        SELECT gen_random_uuid(), j.id, j.scan_id, j.organization_id,
               (ARRAY['probe', 'crawl', 'tls'])[1 + (row_number() OVER ()) %% 3], '{}', 0, '{}', '{}',
               (%(states)s::text[])[1 + (row_number() OVER ()) %% %(n_states)s], j.created_at, 1, 3, 60, 600,
               j.created_at + j.position * interval '1 second', now(), 3, '\\x00'
        FROM scan_jobs j
        WHERE NOT EXISTS (SELECT 1 FROM worker_tasks t WHERE t.scan_job_id = j.id)""",
                 {"states": list(STATES), "n_states": len(STATES)})
    conn.execute("""
        INSERT INTO worker_task_attempts (id, task_id, worker_id, attempt_number, lease_token_hash, status,
                                          leased_at, lease_expires_at, deadline_at, batch_count,
                                          final_batch_accepted, last_seen_at)
        SELECT gen_random_uuid(), t.id, %(worker)s, 1, sha256(t.id::text::bytea),
               CASE WHEN t.state = 'running' THEN 'running' ELSE 'succeeded' END,
               t.created_at, t.created_at + interval '1 minute', t.created_at + interval '1 hour', 0, false,
               t.created_at
        FROM worker_tasks t WHERE t.current_attempt_id IS NULL""", {"worker": worker})
    conn.execute("UPDATE worker_tasks t SET current_attempt_id = a.id FROM worker_task_attempts a"
                 " WHERE a.task_id = t.id AND t.current_attempt_id IS NULL")


def seed(conn: psycopg.Connection[Any], orgs: int) -> tuple[list[UUID], UUID]:
    """``orgs`` organisations and one worker; their ids."""
    ids = [uuid4() for _ in range(orgs)]
    for org in ids:
        conn.execute("INSERT INTO organizations (id, name, created_at, updated_at, version, head_hash)"
                     " VALUES (%s, %s, now(), now(), 1, '\\x00')", (org, f"org-{org}"))
    worker = uuid4()
    conn.execute("""
        INSERT INTO workers (id, name, fingerprint, enabled, max_concurrent_tasks, capabilities, task_types,
                             created_at, updated_at, version, head_hash)
        VALUES (%s, 'w', repeat('a', 64), true, 4, '{}', '{probe}', now(), now(), 1, '\\x00')""", (worker,))
    return ids, worker


def page(org: UUID | None = None, *, before: tuple[datetime, UUID] | None = None, limit: int = 101,
         **filters: Any) -> dict[str, Any]:
    """Parameters of ``scans_page``/``tasks_page`` as the Gateway binds them (limit: a page + 1)."""
    return {"organization_id": org, "created_from": filters.pop("created_from", None),
            "created_to": filters.pop("created_to", None), "before_at": before[0] if before else None,
            "before_id": before[1] if before else None, "limit": limit, **filters}


def cases(orgs: list[UUID], worker: UUID, scans: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, statement, parameters) of every list the bench times."""
    deep = (T0 + timedelta(minutes=17 * scans // 2), UUID(int=0))  # halfway down the list
    none = {"state": None, "task_type": None, "scan_id": None, "worker_id": None}
    return [
        ("scans_all", "scans_page", page(status=None)),
        ("scans_org", "scans_page", page(orgs[0], status=None)),
        ("scans_status", "scans_page", page(status="failed")),
        ("scans_org_deep", "scans_page", page(orgs[1], status=None, before=deep)),
        ("tasks_all", "tasks_page", page(**none)),
        ("tasks_org", "tasks_page", page(orgs[0], **none)),
        ("tasks_state", "tasks_page", page(**{**none, "state": "failed_terminal"})),
        ("tasks_org_state_deep", "tasks_page", page(orgs[1], before=deep, **{**none, "state": "completed"})),
        ("tasks_org_type", "tasks_page", page(orgs[2 % len(orgs)], **{**none, "task_type": "tls"})),
        ("tasks_worker", "tasks_page", page(**{**none, "worker_id": worker})),
        ("queue", "task_queues", {"organization_id": None, "now": None}),
    ]


def measure(conn: psycopg.Connection[Any], statement: str, params: dict[str, Any], runs: int) -> tuple[float, float, int]:
    """Median and p95 milliseconds of ``runs`` runs as the Gateway runs it, and rows the plan read."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            conn.execute(QUERIES["custom_plans"], {})
            conn.execute(QUERIES[statement], params).fetchall()
        times.append((time.perf_counter() - started) * 1000)
    with conn.transaction():
        conn.execute(QUERIES["custom_plans"], {})
        (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + QUERIES[statement], params).fetchone() or ("[]",)
    data = plan if not isinstance(plan, str | bytes) else orjson.loads(plan)
    read = _rows_read(data[0]["Plan"], {"scans", "worker_tasks", "worker_task_attempts"})
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.95))], read


def _rows_read(node: dict[str, Any], tables: set[str]) -> int:
    own = int(node["Actual Rows"] * node.get("Actual Loops", 1)) if node.get("Relation Name") in tables else 0
    return own + sum(_rows_read(child, tables) for child in node.get("Plans", []))


def main() -> None:
    from common import recreate_database, resolve_server_url  # the bench directory's own module

    from leasehold.migrations import runner as migrate

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", help="maintenance URL of the server (default: BENCH_DATABASE_URL, the "
                                          "machine's server, else the embedded one)")
    p.add_argument("--sizes", default="10000,100000", help="task counts to measure at, ascending")
    p.add_argument("--orgs", type=int, default=5)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--scratch-name", default="leasehold_finding_work")
    args = p.parse_args()
    server, source = resolve_server_url(args.database_url)
    print(f"# server: {source}")
    url = recreate_database(server, args.scratch_name)
    migrate.upgrade(url)
    sizes = [int(s) for s in args.sizes.split(",")]
    medians: dict[str, list[float]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        orgs, worker = seed(conn, args.orgs)
        scans = 0
        for size in sizes:
            wanted = size // TASKS_PER_SCAN
            grow(conn, scans=wanted - scans, orgs=orgs, worker=worker, start=scans)
            scans = wanted
            conn.execute("VACUUM ANALYZE")
            for label, statement, params in cases(orgs, worker, scans):
                median, p95, read = measure(conn, statement, params, args.runs)
                medians.setdefault(label, []).append(median)
                print(f"finding_work tasks={size} query={label} p50_ms={median:.3f} p95_ms={p95:.3f} rows_read={read}")
    for label, values in medians.items():
        print(f"finding_work_growth query={label} tasks={sizes[0]}->{sizes[-1]} "
              f"ratio_p50={values[-1] / values[0]:.2f}")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.scratch_name)))


if __name__ == "__main__":
    main()
