"""``bench/scopes.py`` still runs: a small scope through all three steps, on a scratch database of
its own (dropped afterwards). A smoke run, not a timed one: the numbers are not checked."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(\w+) (.+)$", re.MULTILINE)


def test_the_scope_benchmark_measures_building_keeping_and_serving_a_scope(pg_server_url: str) -> None:
    name = f"leasehold_scopes_bench_{secrets.token_hex(4)}"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scopes.py"), "--database-url", pg_server_url, "--database-name", name,
         "--assets", "3000", "--batch", "500", "--extra", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(LINE.findall(result.stdout))
    assert lines["machine"].startswith("cpus=") and "load_average=" in lines["machine"]
    assert (lines["scope_assets"], int(lines["scope_pages"]) > 1) == ("3000", True)
    for name in ("scope_settle_ms", "scope_settle_next_ms", "scope_serve_ms", "scope_agent_file_ms", "scope_build_ms",
                 "yardstick_store_ms"):
        assert float(lines[name]) > 0, name
    assert int(lines["scope_stored_pages_new"]) >= 1
