"""The README's first scan, run as written against an empty database: it migrates, starts the
Gateway as its own login role and a worker agent, scans 127.0.0.1 and must find the Gateway's
worker port open; then the audit passes and both processes stop cleanly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from docs_sessions import run_page

pytestmark = pytest.mark.slow


def test_the_first_scan_finds_the_open_worker_port(empty_database_url: str, tmp_path: Path) -> None:
    outcome = run_page("README.md", empty_database_url, tmp_path)
    out = outcome.output
    found = re.findall(r'"value": ?"127\.0\.0\.1:(\d+)/tcp"', out)
    assert found, out[-4000:]
    assert len(set(found)) == 1, found  # the open worker port, and not the closed one below it
    assert re.search(r'"kind": ?"service"', out)
    assert re.search(r"\bsuccess\b", out) and "completed" in out
    assert "OK: " in out and "events rebuilt" in out, out[-3000:]
    # The Gateway ran as the least-privileged role: it did not warn about its own.
    gateway_log = (tmp_path / "gateway.log").read_text()
    assert "create-app-role" not in gateway_log, gateway_log[-3000:]
    assert '"msg": "stopped"' in gateway_log or "stopped" in gateway_log
