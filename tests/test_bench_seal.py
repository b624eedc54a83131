"""``bench/seal.py`` still runs: a few streams sealed and verified through its own entry point."""

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


def test_the_seal_benchmark_measures_every_step(pg_server_url: str) -> None:
    name = f"leasehold_seal_bench_{secrets.token_hex(4)}"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "seal.py"), "--database-url", pg_server_url, "--database-name", name,
         "--streams", "50", "--changed", "5", "--rounds", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(LINE.findall(result.stdout))
    for step in ("seal_first_ms", "seal_changed_ms", "seal_idle_ms", "sign_us", "sign_event_head_us", "verify_digests_ms"):
        assert float(lines[f"{step}_at_50"]) > 0
    assert (lines["verify_digest_problems_at_50"], lines["unsealed_events_at_50"]) == ("0", "0")
