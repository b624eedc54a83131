"""``leasehold demo`` end to end, as ``make demo`` runs it (on the test's database)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
async def test_demo_runs_a_scan_survives_a_killed_worker_and_audits_clean(database_url: str,
                                                                           tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": database_url, "LEASEHOLD_HOME": str(tmp_path)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "leasehold.cli.main", "demo", env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    assert proc.returncode == 0, text
    assert ": success" in text
    assert "the Gateway connects as leasehold_gateway, a member of leasehold_app only" in text
    assert "attempt 1: expired on worker-a" in text and "attempt 2: succeeded on worker-b" in text
    assert "tls-self-signed" in text
    assert "differ in 0 rows; hash chains: intact" in text
    assert "nothing left running" in text
