"""``scripts/check_row_access.py``: positional row access is caught, reads by name pass (no database)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_row_access.py"

_spec = importlib.util.spec_from_file_location("check_row_access", SCRIPT)
assert _spec is not None and _spec.loader is not None
check_row_access = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_row_access)


def lines_flagged(source: str) -> list[int]:
    return [line for line, _ in check_row_access.check_source(textwrap.dedent(source))]


@pytest.mark.parametrize("source", [
    # an integer subscript, anywhere
    """
    async def f(tx):
        row = await tx.one("task_read", {})
        return row[0]
    """,
    """
    def f(found):
        return found[-1]
    """,
    # a row unpacked into positional names
    """
    async def f(tx):
        found_id, name, enabled, revoked = await tx.one("worker_by_fingerprint", {})
    """,
    """
    async def f(tx):
        (policy,) = await tx.value("organization_target_policy", {})
    """,
    """
    async def f(tx):
        row = await tx.one("worker_read", {})
        wid, version, *_ = row
    """,
    # a row named so, wherever it came from
    """
    def of(row):
        a, b = row
    """,
    # every row of a fetch, unpacked in a loop or a comprehension
    """
    async def f(reader):
        for task_id, attempt_id in await reader.all("worker_attempts_to_cancel", {}):
            pass
    """,
    """
    async def f(tx):
        locked = await tx.all("org_queued_work_lock_flagged", {})
        return [org for org, _ in locked]
    """,
    """
    async def f(cur):
        while rows := await cur.fetchmany(10):
            for oid, version in rows:
                pass
    """,
    # one answer of a pipelined read, unpacked
    """
    async def f(tx):
        row, (next_position, now) = await tx.read(one("scan_lock", {}), one("scan_next_job_position", {}))
    """,
    """
    async def f(tx):
        answers = dict(zip(names, await tx.read(*reads)))
        live, now = answers["live"]
    """,
    # a row sliced, or spread into positional arguments
    """
    def f(r):
        return task_summary(r[9:])
    """,
    """
    async def f(cur):
        return [Partition(*r) for r in await cur.fetchall()]
    """,
])
def test_positional_row_access_is_flagged(source: str) -> None:
    assert lines_flagged(source), source


@pytest.mark.parametrize("source", [
    # reads by name
    """
    async def f(tx):
        row = await tx.one("task_read", {})
        return row.now, [c.task_id for c in await tx.all("worker_cancelling_attempts", {})]
    """,
    # unpacking the answers of a pipelined read (a list of rows, not a row)
    """
    async def f(tx):
        locked, row, standing = await tx.read(one("task_lock", {}), one("task_read", {}), one("x", {}))
        return row.id
    """,
    # tuples that are not rows, and slices of strings
    """
    def f(text, prev):
        version, digest = prev
        first, *rest = text.splitlines()
        return text[:-3]
    """,
    # a subscript that is not a row's, said so
    """
    def f(local):
        return local[1]  # not a row: a socket address
    """,
])
def test_reads_by_name_pass(source: str) -> None:
    assert lines_flagged(source) == [], source


def test_the_packages_read_rows_by_name() -> None:
    """What ``make lint`` runs: persistence/ and gateway/ have no positional row access."""
    done = subprocess.run([sys.executable, str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_script_reports_where(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("async def f(tx):\n    row = await tx.one('q', {})\n    return row[3]\n")
    done = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert f"{bad}:3: a positional subscript" in done.stdout
