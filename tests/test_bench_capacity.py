"""``bench/capacity.py`` still runs: a handful of tasks on a scratch database of the test server
(dropped afterwards), printing the lines the capacity model is read from. A smoke run: the
numbers are not checked beyond being there."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

pytestmark = pytest.mark.slow  # a benchmark smoke run: its own processes and scratch database

BENCH = Path(__file__).resolve().parents[1] / "bench" / "capacity.py"


@pytest.fixture
def scratch(pg_server_url: str) -> Iterator[str]:
    name = f"smoke_capacity_{secrets.token_hex(4)}"
    yield name
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_capacity_bench_prints_its_lines(pg_server_url: str, scratch: str) -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--database-url", pg_server_url, "--database-name", scratch,
                           "--tasks", "6", "--concurrency", "2", "--tasks-per-scan", "2", "--renewals", "1"],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"^capacity tasks=6 .* tasks_per_s=[0-9.]+$", out, re.M), out
    assert re.search(r"^per_task events=[0-9.]+ wal_bytes=\d+ storage_bytes=\d+", out, re.M), out
    assert re.search(r"^per_task_table table=events bytes=\d+", out, re.M), out
    assert len(re.findall(r"^per_day tasks=\d+ events=\d+ wal_gb=[0-9.]+ storage_gb=", out, re.M)) == 3, out
