"""``bench/scale.py`` still runs: a tiny log over 12 partitions, measured empty and loaded, its
oldest partition archived, through its own entry point on a scratch database (dropped after).
A smoke run, not a timed one: the numbers are not checked, only that each is printed."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(scale_\w+) (\S+)", re.MULTILINE)


@pytest.mark.slow
def test_the_scale_benchmark_measures_empty_loaded_and_archive(pg_server_url: str) -> None:
    name = f"smoke_scale_{secrets.token_hex(4)}"
    try:
        result = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "scale.py"), "--database-url", pg_server_url,
             "--database-name", name, "--events", "840", "--acquires", "5", "--cost-lifecycles", "3", "--warmup", "3"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = dict(LINE.findall(result.stdout))
    assert (lines["scale_events"], lines["scale_partitions_filled"]) == ("840", "12")
    for state in ("empty", "loaded"):
        assert float(lines[f"scale_{state}_acquire_p50_ms"]) > 0
        assert float(lines[f"scale_{state}_lifecycle_backend_cpu_ms"]) >= 0
    assert float(lines["scale_ratio_acquire_p50"]) > 0
    assert int(lines["scale_archive_events"]) == 840 // 12
    assert float(lines["scale_archive_events_per_s"]) > 0
