"""The plans of the statements that could use an index migration 0026 dropped or replaced.

Run against a database filled by ``bench/console.py --keep`` (100,000 tasks in every state by
default): each statement is run under ``EXPLAIN (ANALYZE, BUFFERS)`` with parameters taken from
the data (the organisation and the worker with the most tasks, now), after one untimed run, and
prints one line: execution time, shared buffers touched, rows, and the indexes the plan read.
Statements are the project's own (``persistence/queries``), bound on the client as psycopg would
send them, planned for their actual parameters (``plan_cache_mode = force_custom_plan``, as the
list statements run). Run it from the tree whose statements and schema are to be compared.

Usage: ``.venv/bin/python bench/index_plans.py --database-url postgresql://…/leasehold_console_bench``
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg

from leasehold.persistence.queries import QUERIES


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def cases(conn: psycopg.Connection[Any]) -> list[tuple[str, str, dict[str, Any]]]:
    org = conn.execute("SELECT organization_id FROM worker_tasks GROUP BY 1 ORDER BY count(*) DESC LIMIT 1"
                       ).fetchone()[0]  # type: ignore[index]
    worker = conn.execute("SELECT worker_id FROM worker_task_attempts GROUP BY 1 ORDER BY count(*) DESC LIMIT 1"
                          ).fetchone()[0]  # type: ignore[index]
    workers = [r[0] for r in conn.execute("SELECT id FROM workers ORDER BY id LIMIT 36").fetchall()]
    now = datetime.now(UTC)
    page: dict[str, Any] = {"organization_id": None, "state": None, "task_type": None, "scan_id": None,
                            "worker_id": None, "created_from": None, "created_to": None, "before_at": None,
                            "before_id": None, "limit": 101}
    scan_page: dict[str, Any] = {"organization_id": None, "status": None, "created_from": None,
                                 "created_to": None, "before_at": None, "before_id": None, "limit": 101}
    out: list[tuple[str, str, dict[str, Any]]] = [
        ("sweeper: expired leases", "tasks_lock_expired_leases", {"now": now, "limit": 100}),
        ("sweeper: past deadline", "tasks_lock_past_deadline", {"now": now, "limit": 100}),
        ("sweeper: cancelling overdue", "tasks_lock_cancelling_overdue",
         {"now": now, "grace": "30 seconds", "limit": 100}),
        ("task counts, all", "task_counts", {"organization_id": None}),
        ("task counts, one org", "task_counts", {"organization_id": org}),
        ("queue depth sample", "queue_depth_sample", {}),
        ("task queues", "task_queues", {"organization_id": None, "now": now}),
        ("workers last seen (36)", "workers_last_seen", {"worker_ids": workers, "organization_id": None}),
        ("attempts ended, last hour", "console_attempts_ended",
         {"since": datetime.fromtimestamp(now.timestamp() - 3600, UTC), "organization_id": None}),
    ]
    # As the task list chooses (gateway/api/operator/finding_work.py): leased and running tasks
    # through their live attempts where the tree has that statement.
    live = "tasks_page_live" if "tasks_page_live" in QUERIES else "tasks_page"
    for state in ("pending", "retry_wait", "leased", "running", "cancelling", "failed_terminal", "completed"):
        out.append((f"tasks page state={state}", live if state in ("leased", "running") else "tasks_page",
                    {**page, "state": state}))
    out.append(("tasks page worker", "tasks_page", {**page, "worker_id": worker}))
    out.append(("tasks page org+state=running", live, {**page, "organization_id": org, "state": "running"}))
    for status in ("pending", "running", "success", "failed", "cancelled"):
        out.append((f"scans page status={status}", "scans_page", {**scan_page, "status": status}))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database-url", required=True)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    results = []
    with psycopg.connect(args.database_url, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        conn.execute("SET plan_cache_mode = force_custom_plan")
        conn.execute("SET jit = off")
        for label, name, params in cases(conn):
            text = QUERIES[name]
            cur = conn.cursor()
            try:
                statement = cur.mogrify(text, params)
            except (KeyError, psycopg.ProgrammingError) as exc:
                print(f"index_plan case={label!r} skipped={exc!r}")
                continue
            conn.execute("BEGIN")
            conn.execute(f"EXPLAIN (ANALYZE) {statement}")  # warm
            plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}").fetchone()[0][0]  # type: ignore[index]
            conn.execute("ROLLBACK")  # the sweeper's statements lock rows
            nodes = list(_nodes(plan["Plan"]))
            indexes = sorted({n["Index Name"] for n in nodes if "Index Name" in n})
            seqs = sorted({n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan"})
            buffers = plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get("Shared Read Blocks", 0)
            row = {"case": label, "ms": round(plan["Execution Time"], 2), "buffers": buffers,
                   "rows": plan["Plan"]["Actual Rows"], "indexes": indexes, "seq_scans": seqs}
            results.append(row)
            if not args.json:
                print(f"index_plan case={label!r} ms={row['ms']} buffers={buffers} rows={row['rows']} "
                      f"indexes={','.join(indexes) or '-'} seq_scans={','.join(seqs) or '-'}")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
