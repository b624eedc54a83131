"""``bench/bulk.py`` still runs: a small bulk retry whose runner is killed halfway, end to end."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a benchmark smoke run: its own processes and scratch database

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(\w+) (.+)$", re.MULTILINE)


def test_the_bulk_benchmark_kills_its_runner_and_every_task_is_retried_once(pg_server_url: str) -> None:
    name = f"leasehold_bulk_bench_{secrets.token_hex(4)}"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bulk.py"), "--database-url", pg_server_url, "--database-name", name,
         "--tasks", "80", "--makers", "2", "--batch", "20", "--hold", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(LINE.findall(result.stdout))
    assert 40 <= int(lines["reached_at_kill"]) < 80
    assert (lines["retried_once"], lines["retried_twice"], lines["not_retried"]) == ("80", "0", "0")
    assert (lines["done"], lines["status"]) == ("80", "finished")
    assert float(lines["second_runner_tasks_per_s"]) > 0 and float(lines["handover_seconds"]) >= 0
