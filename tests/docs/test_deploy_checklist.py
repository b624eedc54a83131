"""The deploy checklist (docs/guides/deploy/index.md), run as written by ``scripts/deploy_checklist.py``.

The suite runs it against this checkout's own virtualenv (``--installed``: no wheel build, no
``pip install``; the rest of the block exactly as written, in a directory outside the
repository). The full run — the wheel built, installed into a fresh virtualenv, then the same
block — takes about a minute, most of it pip: ``python scripts/deploy_checklist.py
--database-url URL``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from docs_support import ROOT, docs_examples

pytestmark = pytest.mark.slow  # the deploy checklist as written, processes and all


def test_the_deploy_checklist_runs_as_written(empty_database_url: str) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "deploy_checklist.py"), "--installed",
                           str(Path(sys.executable).parent.parent), "--database-url", empty_database_url,
                           "--timeout", "150"], capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("deploy_checklist: OK: the deploy checklist"), done.stdout
    assert any(line.startswith("OK: ") and "events rebuilt" in line for line in lines), done.stdout


def test_the_checklist_runs_the_gateway_as_its_own_least_privileged_role() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from deploy_checklist import checklist
    finally:
        sys.path.pop(0)
    block = checklist()
    for step in ("pip install 'leasehold[server]'", "leasehold migrate\n", "leasehold migrate check",
                 "leasehold db create-app-role", "LEASEHOLD_DATABASE_URL=$GATEWAY_DATABASE_URL leasehold gateway serve",
                 "leasehold worker run", "leasehold replay verify"):
        assert step in block, step
    # The role that migrated never serves: the Gateway's line is the only one naming the new role's URL.
    serve = next(line for line in block.splitlines() if "leasehold gateway serve" in line)
    assert serve.startswith("LEASEHOLD_DATABASE_URL=$GATEWAY_DATABASE_URL "), serve
    assert block.index("leasehold db create-app-role") < block.index("leasehold gateway serve")
    assert docs_examples.has_session(ROOT / "docs" / "guides" / "deploy" / "index.md")
