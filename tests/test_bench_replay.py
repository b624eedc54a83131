"""``bench/replay.py`` still runs: a tiny log made and measured through its own entry point.

The benchmark is not part of CI's measurements, but it drives the real service layer, the
replay library and the migrations, so it breaks whenever they move; this runs it at a few
hundred events (on scratch databases of its own, dropped afterwards) and reads its result lines.
"""

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

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(\w+) (.+)$", re.MULTILINE)


def test_the_replay_benchmark_generates_a_log_and_measures_every_audit(pg_server_url: str) -> None:
    name = f"leasehold_replay_bench_{secrets.token_hex(4)}"
    try:
        result = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "replay.py"), "--database-url", pg_server_url,
             "--database-name", name, "--events", "300", "--sample-scans", "2", "--tasks-per-scan", "4"],
            cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            for database in (name, name + "_sample"):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(LINE.findall(result.stdout))
    events = int(lines["events"])
    assert 300 <= events < 600 and int(lines["generated_events"]) == events
    assert int(lines["rebuild_events"]) == events and int(lines["rebuild_events_per_s"]) > 0
    assert int(lines["rebuild_rows"]) > 0
    assert (lines["verify_chain_problems"], lines["verify_differences"]) == ("0", "0")
    assert int(lines["verify_events_per_s"]) > 0 and int(lines["verify_chain_events_per_s"]) > 0
    assert int(lines["checkpoint_heads_sealed"]) > 0 and lines["checkpoint_incremental_heads"] == "0"
    assert int(lines["peak_rss_mb"]) > 0 and int(lines["rebuild_peak_rss_mb"]) > 0
    # The incremental verify from the checkpoint before the last copy: some events, not all.
    assert 0 < int(lines["verify_since_events"]) < events and lines["verify_since_differences"] == "0"
    assert lines["goal_rebuild_events_per_s"].startswith("100000 met=")
    assert lines["goal_verify_since_vs_full"].startswith("0.02 met=")
