"""``bench/cli_startup.py`` still runs: at one timed run per command it prints every line its
README section documents. A smoke test, not a timed one: the numbers are not checked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_cli_startup_prints_its_lines() -> None:
    done = subprocess.run([sys.executable, str(BENCH / "cli_startup.py"), "--runs", "1"], capture_output=True,
                          text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    times = r"runs=1 median_s=\d+\.\d{3} min_s=\d+\.\d{3} max_s=\d+\.\d{3} median_cpu_s=\d+\.\d{3}"
    expected = [rf"python_startup {times}",
                rf"cli_startup command='worker run --help' {times} ratio_to_python=\d+\.\d",
                r"goal_worker_run_help_s 0\.5 met=(True|False)",
                rf"cli_startup command=--help {times} ratio_to_python=\d+\.\d"]
    lines = done.stdout.splitlines()
    assert len(lines) == len(expected), done.stdout
    for pattern, line in zip(expected, lines, strict=True):
        assert re.fullmatch(pattern, line), (pattern, line)
