"""``bench/presence.py`` still runs: a few workers published through its own entry point."""

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


def test_the_presence_benchmark_measures_every_step(pg_server_url: str) -> None:
    name = f"leasehold_presence_bench_{secrets.token_hex(4)}"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "presence.py"), "--database-url", pg_server_url, "--database-name", name,
         "--workers", "50", "--rounds", "2", "--seconds", "1", "--interval", "0.5", "--pause", "0",
         "--gateway-workers", "5", "--gateway-wait", "1", "--gateway-seconds", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(LINE.findall(result.stdout))
    for step in ("publish_ms", "publish_idle_ms", "wal_bytes_per_publish", "loop_seconds"):
        assert float(lines[f"{step}_at_50"]) > 0, step
    assert 1 <= int(lines["loop_statements_at_50"]) <= 3  # one a half second, whatever the polls
    assert int(lines["loop_polls_at_50"]) >= 50
    assert int(lines["gateway_workers_live_at_5"]) == 5  # all five long-polling workers live
    assert 0 < float(lines["gateway_presence_writes_per_s_at_5"]) <= 3  # one a half second, not one a poll
    assert float(lines["gateway_polls_per_s_at_5"]) > 0
