"""The operator lists stay index-driven at scale: on thousands of scans and tasks of several
organisations, every filter combination of ``scans_page`` and ``tasks_page`` is planned (with
the custom plans the Gateway forces for them) through an index, never a sequential scan, and a
page reads about ``limit`` rows of the table whatever the history holds. The queue statement
reads only the waiting tasks."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import orjson
import psycopg
import pytest

from persistence.queries import QUERIES

SCANS, TASKS_PER_SCAN = 1500, 2  # 3,000 tasks, 3,000 attempts
ORGS = 3
T0 = datetime(2026, 1, 1, tzinfo=UTC)
STATES = ("completed", "completed", "completed", "failed_terminal", "cancelled", "pending", "running")


@pytest.fixture
def grown(database_url: str) -> Iterator[tuple[str, list[UUID], UUID]]:
    """SCANS scans with their jobs, tasks and attempts, spread over ORGS organisations and a month."""
    orgs = [uuid4() for _ in range(ORGS)]
    worker = uuid4()
    with psycopg.connect(database_url, autocommit=True) as conn:
        for org in orgs:
            conn.execute("INSERT INTO organizations (id, name, created_at, updated_at, version, head_hash)"
                         " VALUES (%s, %s, now(), now(), 1, '\\x00')", (org, f"org-{org}"))
        conn.execute("""
            INSERT INTO workers (id, name, fingerprint, enabled, max_concurrent_tasks, capabilities, task_types,
                                 created_at, updated_at, version, head_hash)
            VALUES (%s, 'w', repeat('a', 64), true, 4, '{}', '{probe}', now(), now(), 1, '\\x00')""", (worker,))
        conn.execute("""
            INSERT INTO scans (id, organization_id, status, execution_mode, targets, created_at, updated_at,
                               version, head_hash)
            SELECT gen_random_uuid(), (%(orgs)s::uuid[])[1 + g %% %(n_orgs)s],
                   (ARRAY['success', 'failed', 'running', 'cancelled'])[1 + g %% 4], 'gateway', '{}',
                   %(t0)s + g * interval '17 minutes', now(), 2, '\\x00'
            FROM generate_series(1, %(scans)s) g""",
                     {"orgs": orgs, "n_orgs": ORGS, "t0": T0, "scans": SCANS})
        conn.execute("""
            INSERT INTO scan_jobs (id, scan_id, organization_id, position, plugin, status, execution_mode,
                                   created_at, updated_at)
            SELECT gen_random_uuid(), s.id, s.organization_id, p, 'probe', 'success', 'gateway', s.created_at, now()
            FROM scans s, generate_series(0, %(per)s - 1) p""", {"per": TASKS_PER_SCAN})
        conn.execute("""
            INSERT INTO worker_tasks (id, scan_job_id, scan_id, organization_id, task_type, required_capabilities,
                                      priority, scope, parameters, state, available_at, attempt_count, max_attempts,
                                      lease_seconds, execution_timeout_seconds, created_at, updated_at, version,
                                      head_hash)
            SELECT gen_random_uuid(), j.id, j.scan_id, j.organization_id,
                   (ARRAY['probe', 'crawl', 'tls'])[1 + (row_number() OVER ()) %% 3], '{}', 0, '{}', '{}',
                   (%(states)s::text[])[1 + (row_number() OVER ()) %% %(n_states)s], j.created_at, 1, 3, 60, 600,
                   j.created_at + j.position * interval '1 second', now(), 3, '\\x00'
            FROM scan_jobs j""", {"states": list(STATES), "n_states": len(STATES)})
        conn.execute("""
            INSERT INTO worker_task_attempts (id, task_id, worker_id, attempt_number, lease_token_hash, status,
                                              leased_at, lease_expires_at, deadline_at, batch_count,
                                              final_batch_accepted, last_seen_at)
            SELECT gen_random_uuid(), t.id, %(worker)s, 1, sha256(t.id::text::bytea),
                   CASE WHEN t.state = 'running' THEN 'running' ELSE 'succeeded' END,
                   t.created_at, t.created_at + interval '1 minute', t.created_at + interval '1 hour', 0, false,
                   t.created_at
            FROM worker_tasks t""", {"worker": worker})
        conn.execute("UPDATE worker_tasks t SET current_attempt_id = a.id FROM worker_task_attempts a"
                     " WHERE a.task_id = t.id")
        conn.execute("ANALYZE")
    yield database_url, orgs, worker


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _explain(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> dict[str, Any]:
    with conn.transaction():
        conn.execute(QUERIES["custom_plans"], {})
        row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES[name], params).fetchone()
    assert row is not None
    data = row[0] if not isinstance(row[0], str | bytes) else orjson.loads(row[0])
    plan: dict[str, Any] = data[0]["Plan"]
    return plan


def _page(org: UUID | None = None, *, before: tuple[datetime, UUID] | None = None, limit: int = 51,
          **filters: Any) -> dict[str, Any]:
    return {"organization_id": org, "created_from": filters.pop("created_from", None),
            "created_to": filters.pop("created_to", None), "before_at": before[0] if before else None,
            "before_id": before[1] if before else None, "limit": limit, **filters}


def test_every_list_filter_walks_an_index_in_list_order(grown: tuple[str, list[UUID], UUID]) -> None:
    url, orgs, worker = grown
    middle = (T0 + timedelta(days=9), UUID(int=0))
    week = {"created_from": T0 + timedelta(days=3), "created_to": T0 + timedelta(days=10)}
    task_filters = {"state": None, "task_type": None, "scan_id": None, "worker_id": None}
    cases = [
        ("scans_page", _page(status=None)),
        ("scans_page", _page(orgs[0], status=None)),
        ("scans_page", _page(status="failed")),
        ("scans_page", _page(orgs[1], status="running", before=middle)),
        ("scans_page", _page(orgs[2], status=None, **week)),
        ("tasks_page", _page(**task_filters)),
        ("tasks_page", _page(orgs[0], **task_filters)),
        ("tasks_page", _page(**{**task_filters, "state": "failed_terminal"})),
        ("tasks_page", _page(orgs[1], before=middle, **{**task_filters, "state": "completed"})),
        ("tasks_page", _page(orgs[2], **{**task_filters, "task_type": "tls"})),
        ("tasks_page", _page(orgs[0], **{**task_filters, "worker_id": worker})),
        ("tasks_page", _page(**task_filters, **week)),
    ]
    with psycopg.connect(url) as conn:
        for name, params in cases:
            plan = _explain(conn, name, params)
            nodes = list(_nodes(plan))
            kinds = [n["Node Type"] for n in nodes]
            where = f"{name} {[(k, v) for k, v in params.items() if v is not None]}: {kinds}"
            assert "Seq Scan" not in kinds, where
            table = "scans" if name == "scans_page" else "worker_tasks"
            walks = [n for n in nodes if n.get("Relation Name") == table]
            assert walks and all(n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan")
                                 for n in walks), where
            # A page: about `limit` rows of the table read, however many match in all (an ordered index
            # walk that stops at the page's end; or, when few rows match, an index lookup of those
            # few, sorted).
            assert plan["Actual Rows"] <= params["limit"]
            assert sum(n["Actual Rows"] * n.get("Actual Loops", 1) for n in walks) <= 10 * params["limit"], where


def test_the_queue_reads_only_waiting_tasks(grown: tuple[str, list[UUID], UUID]) -> None:
    url, orgs, _ = grown
    with psycopg.connect(url) as conn:
        for org in (None, orgs[0]):
            plan = _explain(conn, "task_queues", {"organization_id": org, "now": None})
            kinds = [n["Node Type"] for n in _nodes(plan)]
            assert "Seq Scan" not in kinds, kinds
            reads = sum(n["Actual Rows"] for n in _nodes(plan) if n.get("Relation Name") == "worker_tasks")
            waiting = SCANS * TASKS_PER_SCAN // len(STATES) + 1
            assert reads <= waiting, (reads, kinds)
