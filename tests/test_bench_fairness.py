"""``bench/fairness.py`` still runs: every section at a tiny size, on a scratch database of its
own (dropped afterwards), printing every line its README section documents. A smoke test, not a
timed one: the numbers are not checked, only that they are there (and that with fair shares off
the flood is served first, which is what the benchmark contrasts)."""

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
NUMBER = r"-?\d+(\.\d+)?"


def test_the_fairness_benchmark_prints_its_lines(pg_server_url: str) -> None:
    name = f"leasehold_fair_bench_{secrets.token_hex(4)}"
    try:
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "fairness.py"), "--database-url", pg_server_url,
             "--database-name", name, "--flood", "60", "--others", "4", "--workers", "2", "--task-ms", "1",
             "--head-start", "2", "--window", "4", "--cost-orgs", "1,3", "--cost-acquires", "3", "--cost-warmup", "1"],
            cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            for database in (name, f"{name}_template"):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for label in ("idle", "fair", "unfair"):
        for org in ("B", "C"):
            assert re.search(rf"^wait {label} org={org} n=4 p50_ms={NUMBER} p99_ms={NUMBER} ", out, re.M), out
        assert re.search(rf"^run {label} leases=\d+ seconds={NUMBER} leases_per_s={NUMBER}$", out, re.M), out
    for label in ("fair", "unfair"):
        assert re.search(rf"^shares_over_time {label} window=4 A/B/C: [0-9./ ]+", out, re.M), out
        share = rf"({NUMBER}|nan)"
        assert re.search(rf"^shares_while_all_have_work {label} leases=\d+ A={share} B={share} C={share} weights=1/1/1 "
                         rf"max_relative_deviation={share} within_10_percent=(True|False)$", out, re.M), out
        assert re.search(rf"^goal_p99_within_3_task_durations_of_idle {label} worst={NUMBER} met=(True|False)$",
                         out, re.M), out
    for n in (1, 3):
        assert re.search(rf"^acquire_cost organizations={n} queued=\d+ n=3 p50_ms={NUMBER} p99_ms={NUMBER} ", out,
                         re.M), out
        assert re.search(rf"^acquire_served organizations={n} busy=1 queued=\d+ n=3 p50_ms={NUMBER} p99_ms={NUMBER} "
                         rf"ratio_p50_to_first={NUMBER} probe_rows=1 probe_buffers=\d+ ratio_buffers_to_first={NUMBER} ",
                         out, re.M), out
    assert re.search(rf"^goal_acquire_p50_at_3_orgs_within_1.2x_of_1 ratio={NUMBER} met=(True|False)$", out, re.M), out
    assert re.search(rf"^goal_probe_buffers_at_3_orgs_within_2x_of_1 ratio={NUMBER} met=(True|False)$", out, re.M), out
    unfair = re.search(r"^shares_over_time unfair window=4 A/B/C: (\S+)", out, re.M)
    assert unfair is not None and unfair.group(1) == "1.00/0.00/0.00", out  # oldest first: the flood's head
