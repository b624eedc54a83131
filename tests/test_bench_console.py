"""``bench/console.py`` still runs: a tiny database filled, a Gateway process started, every page
timed through its own entry point. A smoke test, not a timed one: the numbers are not checked,
only that each line is there and that the pages read the bulk-loaded rows (status 200)."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

pytestmark = pytest.mark.slow  # a benchmark smoke run: its own processes and scratch database

ROOT = Path(__file__).resolve().parents[1]
PAGE = re.compile(r"^console_page page=(\S+) status=(\d+) runs=2 p50_ms=[\d.]+ p95_ms=[\d.]+ "
                  r"max_ms=[\d.]+ goal_ms=300 met=(True|False|n/a)$")


def test_the_console_benchmark_times_every_page(pg_server_url: str) -> None:
    name = f"leasehold_console_bench_{secrets.token_hex(4)}"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "console.py"), "--database-url", pg_server_url, "--database-name", name,
         "--tasks", "200", "--organizations", "3", "--runs", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    data = dict(part.split("=") for part in lines[0].removeprefix("console_data ").split())
    assert lines[0].startswith("console_data ") and data["tasks"] == "204"  # and the four made by commands
    states = dict(part.split("=") for part in lines[1].removeprefix("console_data_states ").split())
    assert sum(map(int, states.values())) == 204 and {"completed", "pending", "running"} <= set(states)
    pages = {}
    for line in lines[2:-1]:
        found = PAGE.match(line)
        assert found is not None, line
        pages[found.group(1)] = found.group(2)
    for page in ("overview", "scans", "scans?status=running", "scan:running:bulk", "task:expired+retried:bulk",
                 "task:completed:commands", "overview:org-key", "scans:org-key"):
        assert pages[page] == "200", (page, result.stdout)
    assert re.fullmatch(r"console_goal goal_ms=300 pages_over=\d+( over=\S.*)?", lines[-1])
    with psycopg.connect(pg_server_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone() == (0,)
