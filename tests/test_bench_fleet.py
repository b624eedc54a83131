"""``bench/fleet.py`` still runs: its smoke shape (40 simulated workers over mTLS, 8 organisations,
8 three-step scans, kills and a Gateway restart) on a scratch database of its own (dropped
afterwards). A smoke run, not a timed one: the lines must parse, every scan finish, no task be
lost or run twice; the timed figures are not judged."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(\w+) (.+)$", re.MULTILINE)
GOAL = re.compile(r"^goal_(\w+) (\S+) (\S+) met=(True|False)$", re.MULTILINE)


def test_the_fleet_benchmark_runs_a_small_fleet_to_the_end(pg_server_url: str) -> None:
    name = f"leasehold_fleet_bench_{secrets.token_hex(4)}"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fleet.py"), "--smoke", "--database-url", pg_server_url,
         "--database-name", name], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(LINE.findall(result.stdout))
    assert lines["machine"].startswith("cpus=") and "load_average=" in lines["machine"]
    for key in ("idle_xact_per_s", "idle_pg_cpu", "gateway_rss_start_mib", "gateway_rss_end_mib", "time_scale",
                "complete_p50_ms", "complete_p99_ms", "idle_operator_p99_ms", "operator_p99_ms", "share_min_ratio", "share_max_ratio"):
        assert float(lines[key]) >= 0, key
    assert int(lines["idle_long_polls"]) == int(lines["workers"]) == 40
    assert lines["scans_finished"] == lines["scans_succeeded"] == lines["scans_expected"] == "8"
    assert (lines["tasks_lost"], lines["tasks_run_twice"]) == ("0", "0")
    assert float(lines["gateway_restart_s"]) > 0
    goals = {m[0]: m[3] for m in GOAL.findall(result.stdout)}
    assert set(goals) == {"idle_xact_per_s", "idle_operator_p99_ms", "tasks_lost_or_run_twice", "scans_succeeded",
                          "rss_end_over_start"}
    assert goals["tasks_lost_or_run_twice"] == goals["scans_succeeded"] == "True"
