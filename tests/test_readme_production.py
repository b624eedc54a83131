"""README.md's deploy checklist, run as written by ``scripts/readme_production.py``.

The suite runs it against this checkout's own virtualenv (``--installed``: no wheel build, no
``pip install``; the rest of the block exactly as written, in a directory outside the
repository). The full run — the wheel built, installed into a fresh virtualenv, then the same
block — takes about a minute, most of it pip: ``python scripts/readme_production.py
--database-url URL``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the deploy checklist from a built wheel, processes and all

ROOT = Path(__file__).resolve().parents[1]


def test_the_deploy_checklist_runs_as_written(empty_database_url: str) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_production.py"), "--installed",
                           str(Path(sys.executable).parent.parent), "--database-url", empty_database_url,
                           "--timeout", "120"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("readme_production: OK: the deploy checklist"), done.stdout
    assert any(line.startswith("OK: ") and "events rebuilt" in line for line in lines), done.stdout


def test_the_checklist_is_in_the_readme() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from readme_production import checklist
    finally:
        sys.path.pop(0)
    block = checklist()
    for step in ("pip install 'leasehold[server]'", "leasehold migrate\n", "leasehold migrate check",
                 "leasehold gateway serve", "leasehold worker run", "leasehold replay verify"):
        assert step in block, step
