"""The unit tier cannot quietly reach a database: its conftest stops the run when a unit test asks
for one, and fails a test that connects or starts a server by hand.

Checked on a copy of the tier's conftest under a stand-in root conftest (whose database fixture
would otherwise hand out a URL), run by a separate pytest so that the refusal itself is seen.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

UNIT_CONFTEST = Path(__file__).with_name("conftest.py")
REPO_ROOT = Path(__file__).resolve().parents[2]

ROOT_CONFTEST = '''
import pytest

@pytest.fixture(scope="session")
def pg_server_url():
    return "postgresql://postgres@127.0.0.1:1/postgres"

@pytest.fixture
def database_url(pg_server_url):
    return pg_server_url
'''


def _run_pytest(tmp_path: Path, tests: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(ROOT_CONFTEST)
    unit = tmp_path / "unit"
    unit.mkdir()
    (unit / "conftest.py").write_text(UNIT_CONFTEST.read_text())
    (unit / "test_probe.py").write_text(tests)
    # `-rN`: no short summary, whose lines are cut to the terminal width (so a count would depend on it).
    # Without the installed plugins (hypothesis, schemathesis…): the probe needs none, and starts faster.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN",
                           str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_unit_test_that_asks_for_a_database_stops_the_run(tmp_path: Path) -> None:
    result = _run_pytest(tmp_path, "def test_pure():\n    pass\n\n"
                                   "def test_wants_a_database(database_url):\n    pass\n")
    output = result.stdout + result.stderr
    assert result.returncode == 4, output  # a usage error: nothing ran
    assert "unit/test_probe.py::test_wants_a_database (via database_url, pg_server_url)" in output
    assert "test_pure" not in output


def test_a_unit_test_that_connects_or_starts_a_server_fails(tmp_path: Path) -> None:
    result = _run_pytest(tmp_path, (
        "import psycopg\n"
        "from leasehold.cli.embedded import EmbeddedPostgres\n\n"
        "def test_fixture_by_name(request):\n    request.getfixturevalue('pg_server_url')\n\n"
        "def test_connects():\n    psycopg.connect('postgresql://postgres@127.0.0.1:1/postgres')\n\n"
        "def test_starts_a_server(tmp_path):\n    EmbeddedPostgres(tmp_path / 'pgdata').start()\n"))
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert output.count("the unit tier has no database") == 3, output
    assert "3 failed" in output
