"""``bench/degrade.py`` still runs: every phase, briefly, with its numbers."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a benchmark smoke run: its own process and scratch database

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(\w+) (.+)$", re.MULTILINE)


def test_the_degrade_benchmark_measures_every_phase(pg_server_url: str) -> None:
    name = f"leasehold_degrade_bench_{secrets.token_hex(4)}"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "degrade.py"), "--database-url", pg_server_url, "--database-name", name,
         "--loops", "1", "--phase-seconds", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(LINE.findall(result.stdout))
    for phase in ("baseline", "idle_in_transaction", "long_reader", "released"):
        assert float(lines[f"{phase}_lifecycles_per_s"]) > 0, phase
        assert float(lines[f"{phase}_acquire_p99_ms"]) >= float(lines[f"{phase}_acquire_p50_ms"]) > 0
        assert 0 <= int(lines[f"{phase}_hot_pct_scan_jobs"]) <= 100
    # The idle transaction holds back cleanup: the dead versions it pins are still there.
    assert int(lines["idle_in_transaction_dead_worker_tasks"]) > 0
    assert "# worker_tasks: " in result.stdout and "fillfactor=70" in result.stdout
