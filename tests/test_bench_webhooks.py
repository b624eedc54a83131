"""``bench/webhooks.py`` still runs: a few notifications delivered with two batch sizes, end to end."""

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


def test_the_webhooks_benchmark_delivers_every_notification(pg_server_url: str) -> None:
    name = f"leasehold_webhooks_bench_{secrets.token_hex(4)}"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "webhooks.py"), "--database-url", pg_server_url,
         "--database-name", name, "--notifications", "60", "--batches", "5,20", "--rounds", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(LINE.findall(result.stdout))
    assert lines["notifications"] == "60" and (lines["received_twice"], lines["refused"]) == ("0", "0")
    assert float(lines["batch_5_delivered_per_s"]) > 0 and float(lines["batch_20_delivered_per_s"]) > 0
