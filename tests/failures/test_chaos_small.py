"""``bench/chaos.py`` at CI size: 3 worker processes, 150 tasks, ~40 s of every fault kind.

The soak runs as a subprocess against this module's own PostgreSQL (``owned_pg_server``, which
it crashes with immediate restarts), with its own Gateway, workers and fault proxies. The test
asserts what the soak prints: every checker count 0 (lost, completed twice, stale result
accepted, batch ingested twice, stuck, and the side table's checks), ``replay verify`` and
``verify-chain`` clean, and every fault kind injected at least once — a run without faults
proves nothing, so it fails too. None of this depends on luck: the soak deals its first round of
faults in full, and its own stalled worker (``stale_write``) has a late write refused in every run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.agent import pid_alive

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"
KINDS = ("worker_kill", "worker_stop", "gateway_restart", "pg_restart", "blackhole", "partition", "drop_response",
         "stale_write")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_chaos_soak_loses_nothing_doubles_nothing_and_replays_clean(owned_pg_server: Any, tmp_path: Path) -> None:
    args = [sys.executable, str(BENCH), "--workers", "3", "--tasks", "110", "--fault-seconds", "30",
            "--fault-interval", "2", "--lease-seconds", "4", "--concurrency", "3", "--work-seconds", "0.2,1.2",
            "--drain-seconds", "150", "--progress-seconds", "10", "--request-timeout-seconds", "2",
            "--pg-data-dir", str(owned_pg_server.server.data_dir), "--workdir", str(tmp_path / "chaos"), "--json"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=360, check=False)
    assert done.stdout.strip(), done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    context = f"{json.dumps(result, indent=1)}\n{done.stderr[-3000:]}"

    assert result["counts"] == {
        "lost": 0, "completed_twice": 0, "stale_accepted": 0, "ingested_twice": 0, "stuck": 0,
        "attempt_ran_twice": 0, "completed_without_execution": 0, "execution_without_attempt": 0,
        "stale_other_write": 0, "created_twice": 0}, context
    assert result["completed"] == 110, context
    assert result["verify"]["ok"] is True and result["verify"]["differences"] == 0, context
    assert result["verify_chain"]["ok"] is True and result["verify_chain"]["problems"] == 0, context
    assert all(result["faults"][kind] >= 1 for kind in KINDS), context
    assert result["responses_dropped"] >= 1, context  # a drop rule did hit a request
    # The faults bit: leases expired and stale writes were refused (not merely scheduled). The soak's
    # own stalled worker (``stale_write``) makes both happen in every run, whatever the random faults hit.
    assert result["notes"].get("stale_write_refused") == 1 and "stale_write_accepted" not in result["notes"], context
    assert result["effects"]["event_LeaseExpired"] >= 1 and result["effects"]["event_WriteRejected"] >= 1, context
    assert result["notes"].get("unexpected_worker_exits", 0) == 0, context
    assert result["notes"].get("unexpected_gateway_exits", 0) == 0, context
    assert result["ok"] is True and done.returncode == 0, context
    assert all(code == 0 for code in result["worker_exit_codes"]), context  # graceful stops at the end
    assert not [pid for pid in _plugin_pids(tmp_path / "chaos") if _still_a_plugin(pid)], "plugins left behind"


def _plugin_pids(workdir: Path) -> list[int]:
    """Plugin processes the soak's workers started (from their logs)."""
    pids = []
    for log in workdir.glob("worker-*.log"):
        for raw in log.read_text(errors="replace").splitlines():
            if '"plugin started"' in raw:
                pids.append(int(json.loads(raw)["pid"]))
    return pids


def _still_a_plugin(pid: int) -> bool:
    try:
        return pid_alive(pid) and b"chaos_plugin" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
