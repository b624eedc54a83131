"""``bench/finding_work.py`` still runs: at a tiny size, on a scratch database of its own (dropped
afterwards), it prints a line per size and list, and the growth ratios. A smoke run, not a timed
one: the numbers are not checked."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

pytestmark = pytest.mark.slow  # a benchmark smoke run: its own processes and scratch database

BENCH = Path(__file__).resolve().parents[1] / "bench"
NUMBER = r"[0-9.]+"
QUERIES = ("scans_all", "scans_org", "scans_status", "scans_org_deep", "tasks_all", "tasks_org", "tasks_state",
           "tasks_org_state_deep", "tasks_org_type", "tasks_worker", "queue")


def test_finding_work_prints_every_list_at_every_size(pg_server_url: str) -> None:
    name = f"smoke_find_{secrets.token_hex(4)}"
    try:
        done = subprocess.run([sys.executable, str(BENCH / "finding_work.py"), "--database-url", pg_server_url,
                               "--sizes", "200,400", "--runs", "1", "--orgs", "3", "--scratch-name", name],
                              capture_output=True, text=True, check=False, timeout=300)
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    expected = [rf"finding_work tasks={size} query={query} p50_ms={NUMBER} p95_ms={NUMBER} rows_read=\d+"
                for size in (200, 400) for query in QUERIES]
    expected += [rf"finding_work_growth query={query} tasks=200->400 ratio_p50={NUMBER}" for query in QUERIES]
    assert len(lines) == len(expected), done.stdout
    for pattern, line in zip(expected, lines, strict=True):
        assert re.fullmatch(pattern, line), (pattern, line)
