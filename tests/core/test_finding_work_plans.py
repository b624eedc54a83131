"""The operator lists stay index-driven at scale: on thousands of scans and tasks of several
organisations, every filter combination of ``scans_page`` and ``tasks_page`` reads the listed
table (with the custom plans the Gateway forces for them) through an index, never a sequential
scan, and about ``limit`` rows of it whatever the history holds. The queue statement reads only
the waiting tasks. How long pages take as the history grows: ``bench/finding_work.py``."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import orjson
import psycopg
import pytest

from bench.finding_work import STATES, T0, TASKS_PER_SCAN, grow, seed
from bench.finding_work import page as bench_page
from leasehold.persistence.queries import QUERIES

SCANS = 5000  # 10,000 tasks and attempts
ORGS = 3


@pytest.fixture
def grown(database_url: str) -> Iterator[tuple[str, list[UUID], UUID]]:
    """SCANS scans with their jobs, tasks and attempts (bench/finding_work.py's data), over ORGS
    organisations and a month."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        orgs, worker = seed(conn, ORGS)
        grow(conn, scans=SCANS, orgs=orgs, worker=worker)
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


def test_every_list_filter_walks_an_index_in_list_order(grown: tuple[str, list[UUID], UUID]) -> None:
    url, orgs, worker = grown
    page = functools.partial(bench_page, limit=101)  # a page of 100 (the default), as the Gateway asks: limit + 1
    middle = (T0 + timedelta(days=9), UUID(int=0))
    week = {"created_from": T0 + timedelta(days=3), "created_to": T0 + timedelta(days=10)}
    task_filters = {"state": None, "task_type": None, "scan_id": None, "worker_id": None}
    cases = [
        ("scans_page", page(status=None)),
        ("scans_page", page(orgs[0], status=None)),
        ("scans_page", page(status="failed")),
        ("scans_page", page(orgs[1], status="running", before=middle)),
        ("scans_page", page(orgs[2], status=None, **week)),
        ("tasks_page", page(**task_filters)),
        ("tasks_page", page(orgs[0], **task_filters)),
        ("tasks_page", page(**{**task_filters, "state": "failed_terminal"})),
        ("tasks_page", page(orgs[1], before=middle, **{**task_filters, "state": "completed"})),
        ("tasks_page", page(orgs[2], **{**task_filters, "task_type": "tls"})),
        ("tasks_page", page(orgs[0], **{**task_filters, "worker_id": worker})),
        ("tasks_page", page(**task_filters, **week)),
    ]
    with psycopg.connect(url) as conn:
        for name, params in cases:
            plan = _explain(conn, name, params)
            nodes = list(_nodes(plan))
            kinds = [n["Node Type"] for n in nodes]
            where = f"{name} {[(k, v) for k, v in params.items() if v is not None]}: {kinds}"
            table = "scans" if name == "scans_page" else "worker_tasks"
            walks = [n for n in nodes if n.get("Relation Name") == table]
            # (The page's few rows may meet their attempts any way the planner likes: on a table
            # this small, hashing all of them is cheaper than probing; bench/finding_work.py times
            # pages on 100,000 tasks.)
            assert walks and all(n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan")
                                 for n in walks), where
            # A page: about `limit` rows of the table read, however many match in all (an ordered index
            # walk that stops at the page's end; or, when few rows match, an index lookup of those
            # few, sorted).
            assert plan["Actual Rows"] <= params["limit"]
            assert sum(n["Actual Rows"] * n.get("Actual Loops", 1) for n in walks) <= 10 * params["limit"], where
        # Leased and running tasks (no worker_tasks index names state): reached from the live
        # attempts, each task probed by its key; the tasks read are at most the live attempts.
        live = conn.execute("SELECT count(*) FROM worker_task_attempts WHERE live").fetchone()
        assert live is not None and live[0] > 0
        for params in (page(**{**task_filters, "state": "running"}),
                       page(orgs[0], **{**task_filters, "state": "running"})):
            plan = _explain(conn, "tasks_page_live", params)
            walks = [n for n in _nodes(plan) if n.get("Relation Name") == "worker_tasks"]
            assert walks and all(n["Node Type"] == "Index Scan" for n in walks), list(_nodes(plan))
            assert sum(n["Actual Rows"] * n.get("Actual Loops", 1) for n in walks) <= live[0]
            assert 0 < plan["Actual Rows"] <= params["limit"]


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
