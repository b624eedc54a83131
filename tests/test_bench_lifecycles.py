"""The lifecycle benchmarks still run: each at a tiny size through its real entry point, on scratch
databases of its own on the test server (dropped afterwards), printing the lines its README
section documents. Smoke runs, not timed ones: the numbers are not checked."""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

pytestmark = pytest.mark.slow  # benchmark smoke runs: each starts its benchmark's processes and scratch databases

BENCH = Path(__file__).resolve().parents[1] / "bench"
YARDSTICKS = Path(__file__).resolve().parents[2] / "shared" / "bench"
NUMBER = r"[0-9.]+"


@pytest.fixture
def scratch(pg_server_url: str) -> Iterator[str]:
    """A prefix for the scratch databases of one run; every database it names is dropped after."""
    prefix = f"smoke_{secrets.token_hex(4)}"
    yield prefix
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        names = [r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                                            (prefix + "%",)).fetchall()]
        for name in names:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _run(script: str, *args: str, timeout: int = 300) -> list[str]:
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True,
                          check=False, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout.splitlines()


def _line(lines: list[str], pattern: str) -> str:
    found = [line for line in lines if re.match(pattern, line)]
    assert found, f"no line matches {pattern!r} in:\n" + "\n".join(lines)
    return found[0]


@pytest.mark.skipif(shutil.which("pgbench") is None or shutil.which("psql") is None,
                    reason="the yardsticks need pgbench and psql on PATH")
def test_core_lifecycle_runs_every_section_but_the_history(pg_server_url: str, scratch: str) -> None:
    # The physical-limit yardstick lives beside the checkout; a clone elsewhere runs the rest.
    has_yardstick = (YARDSTICKS / "pg_limit.sh").exists()
    lines = _run("core_lifecycle.py", "--database-url", pg_server_url, "--scratch-prefix", scratch,
                 "--seconds", "1", "--warmup", "0.3", "--concurrency", "2", "--processes", "2",
                 "--cost-lifecycles", "5", "--skip", "history", *(() if has_yardstick else ("--skip", "limit")))
    if has_yardstick:
        _line(lines, rf"pg_limit clients=2 seconds=1 lifecycles_per_s={NUMBER}$")
        _line(lines, rf"replica_lifecycle clients=2 seconds=1 lifecycles_per_s={NUMBER} "
                     rf"ratio_to_pg_limit={NUMBER}")
        _line(lines, rf"ratio_to_pg_limit={NUMBER} ")
    _line(lines, rf"replica_lifecycle clients=2 seconds=1 lifecycles_per_s={NUMBER}")
    _line(lines, rf"core_lifecycle procs=1 conc=2 .* lifecycles_per_s={NUMBER}$")
    _line(lines, rf"core_lifecycle procs=2 conc=2 .* lifecycles_per_s={NUMBER}$")
    _line(lines, rf"ratio_to_replica={NUMBER} ")
    _line(lines, rf"core_profile_scans procs=1 conc=2 steps=3 targets=4 tasks=\d+ tasks_per_s={NUMBER}")
    _line(lines, rf"core_paced share=0.1 offered_per_s={NUMBER} lifecycles=\d+ create_task_p50={NUMBER}")
    cost = _line(lines, r"cost_per_lifecycle round_trips=")
    assert "statements=" in cost
    _line(lines, rf"cost_per_lifecycle xact_commit={NUMBER} tup_inserted={NUMBER} tup_updated={NUMBER} "
                 rf"wal_bytes={NUMBER}")
    for command in ("create_task", "acquire", "complete"):
        _line(lines, rf"cost_per_command {command} round_trips={NUMBER}")


def test_gateway_lifecycle_drains_a_small_queue(pg_server_url: str, scratch: str) -> None:
    lines = _run("gateway_lifecycle.py", "--database-url", pg_server_url, "--scratch-prefix", scratch,
                 "--tasks", "40", "--loops", "2", "--workers", "2", "--scans", "4", "--processes", "1",
                 "--client-processes", "1", "--long-poll-tries", "2", "--skip-yardsticks",
                 "--modes", "v1,4+carry")
    line = _line(lines, rf"gateway_lifecycle processes=1 loops=2 .*requests_per_task=2 tasks=40 "
                        rf"tasks_per_s={NUMBER} .*errors={{}}")
    assert "acquire_p50_ms=" in line
    _line(lines, rf"gateway_lifecycle_cpu_ms_per_task box={NUMBER} gateway={NUMBER}")
    # Several leases per acquire, and the next acquire carried by the completion: fewer requests.
    many = _line(lines, rf"gateway_lifecycle .* mode=max4\+carry requests_per_task_measured=({NUMBER}) "
                        rf"leases_per_answer={{.*}} tasks=40 tasks_per_s={NUMBER} .*errors={{}} loadavg=")
    measured = re.search(r"requests_per_task_measured=([0-9.]+)", many)
    assert measured is not None and float(measured.group(1)) < 1.5


def test_wakeup_measures_the_notify_path(pg_server_url: str, scratch: str) -> None:
    lines = _run("wakeup.py", "--database-url", pg_server_url, "--scratch-name", scratch, "--tries", "3",
                 "--no-redis")
    _line(lines, r"wakeup path=notify tries=3 ")


def test_ledger_counts_each_command(pg_server_url: str, scratch: str) -> None:
    # On the test server (no pg_stat_statements there, most likely: statements then print None).
    lines = _run("ledger.py", "--database-url", pg_server_url, "--scratch-prefix", scratch,
                 "--lifecycles", "3", "--warmup", "1")
    for command in ("create_task", "acquire", "renew", "submit_batch", "complete", "lifecycle"):
        _line(lines, rf"ledger_command command={command} statements=(None|{NUMBER}) commits={NUMBER} "
                     rf"rows_inserted={NUMBER} rows_updated={NUMBER} hot_updated={NUMBER} "
                     rf"index_entries={NUMBER} wal_bytes={NUMBER}$")
    # A task row exists after create_task, and a renewal updates it (the counts are live).
    _line(lines, r"ledger_table command=create_task table=worker_tasks indexes=\d+ inserted=1.0 ")
    _line(lines, r"ledger_table command=renew table=worker_tasks indexes=\d+ inserted=0.0 updated=1.0 ")
