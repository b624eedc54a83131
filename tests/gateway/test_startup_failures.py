"""``leasehold gateway serve`` that cannot start says why in one line and exits 1 within seconds.

Each case is a real ``leasehold gateway serve`` subprocess: the port taken, a server key that is
not its certificate's, an unreachable database, an unmigrated database, a database at another
schema revision, an invalid setting (exit 2, a usage error). Nothing may be left running: the
process must have exited, not merely printed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from leasehold.cli.dev_ca import init_pki
from leasehold.gateway.tls import PkiPaths
from leasehold.persistence.urls import database_label

DEADLINE_SECONDS = 10


def serve(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """Run ``leasehold gateway serve ARGS``; (exit code, stderr, seconds). Fails the test if it is
    still running after the deadline."""
    started = time.monotonic()
    environment = {k: v for k, v in os.environ.items() if not k.endswith("DATABASE_URL")}
    environment.update({"LEASEHOLD_LOG_LEVEL": "WARNING", **(env or {})})
    try:
        done = subprocess.run([sys.executable, "-m", "leasehold.cli.main", "gateway", "serve", *args], env=environment,
                              capture_output=True, text=True, timeout=DEADLINE_SECONDS)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"still running after {DEADLINE_SECONDS} s; stderr so far: {exc.stderr!r}") from exc
    return done.returncode, done.stderr, time.monotonic() - started


def ports(*extra: str) -> list[str]:
    return ["--worker-port", "0", "--operator-port", "0", *extra]


def error_line(stderr: str) -> str:
    """The one ``leasehold: error:`` line (and no traceback)."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("leasehold: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_port_in_use(database_url: str, pki: PkiPaths) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, stderr, _ = serve("--database-url", database_url, "--pki-dir", str(pki.directory),
                                "--worker-port", str(port), "--operator-port", "0")
    assert code == 1
    line = error_line(stderr)
    assert f"127.0.0.1:{port}" in line and "worker port" in line and "in use" in line, line


def test_server_key_that_does_not_match_its_certificate(database_url: str, pki: PkiPaths, tmp_path: Path) -> None:
    other = init_pki(tmp_path / "other")
    code, stderr, _ = serve("--database-url", database_url, "--ca-file", str(pki.ca_cert),
                            "--cert-file", str(pki.server_cert), "--key-file", str(other.server_key), *ports())
    assert code == 1
    line = error_line(stderr)
    assert "does not match" in line and str(other.server_key) in line, line


def test_missing_certificate_file(database_url: str, pki: PkiPaths, tmp_path: Path) -> None:
    code, stderr, _ = serve("--database-url", database_url, "--ca-file", str(pki.ca_cert),
                            "--cert-file", str(tmp_path / "nope.pem"), "--key-file", str(pki.server_key), *ports())
    assert code == 1
    assert "no such file" in error_line(stderr)


def test_unreachable_database(pki: PkiPaths) -> None:
    code, stderr, _ = serve("--database-url", "postgresql://leasehold:s3cret@127.0.0.1:1/leasehold",
                            "--pki-dir", str(pki.directory), *ports())
    assert code == 1
    line = error_line(stderr)
    assert "cannot connect to the database at 127.0.0.1:1/leasehold" in line, line
    assert "s3cret" not in stderr


@pytest.mark.parametrize("setting", ["read", "notify"])
def test_unreachable_read_or_notify_database(database_url: str, pki: PkiPaths, setting: str) -> None:
    code, stderr, _ = serve("--database-url", database_url, f"--{setting}-database-url",
                            "postgresql://leasehold:s3cret@127.0.0.1:1/replica", "--pki-dir", str(pki.directory),
                            *ports())
    assert code == 1
    line = error_line(stderr)
    assert f"cannot connect to the {setting} database at 127.0.0.1:1/replica" in line, line
    assert "s3cret" not in stderr


def test_read_database_at_another_revision(database_url: str, empty_database_url: str, pki: PkiPaths) -> None:
    code, stderr, _ = serve("--database-url", database_url, "--read-database-url", empty_database_url,
                            "--pki-dir", str(pki.directory), *ports())
    assert code == 1
    line = error_line(stderr)
    assert "not migrated" in line, line
    assert f"the read database at {database_label(empty_database_url)}" in line, line


def test_unmigrated_database(empty_database_url: str, pki: PkiPaths) -> None:
    code, stderr, _ = serve("--database-url", empty_database_url, "--pki-dir", str(pki.directory), *ports())
    assert code == 1
    line = error_line(stderr)
    assert "not migrated" in line and "leasehold migrate" in line, line


def test_database_at_another_revision(database_url: str, pki: PkiPaths) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0008'")
    code, stderr, _ = serve("--database-url", database_url, "--pki-dir", str(pki.directory), *ports())
    assert code == 1
    line = error_line(stderr)
    assert "at revision 0008" in line, line


@pytest.mark.parametrize(("args", "named"), [
    (("--worker-port", "70000"), "--worker-port"),
    (("--pool-size", "many"), "--pool-size"),
])
def test_invalid_setting(pki: PkiPaths, args: tuple[str, ...], named: str) -> None:
    code, stderr, _ = serve("--database-url", "postgresql://127.0.0.1:1/x", "--pki-dir", str(pki.directory), *args)
    assert code == 2
    assert named in error_line(stderr)


def test_no_tls_material(database_url: str) -> None:
    code, stderr, _ = serve("--database-url", database_url, *ports())
    assert code == 1
    assert "--pki-dir" in error_line(stderr)


def test_unreadable_admin_key_file(database_url: str, pki: PkiPaths, tmp_path: Path) -> None:
    code, stderr, _ = serve("--database-url", database_url, "--pki-dir", str(pki.directory),
                            "--admin-api-key-file", str(tmp_path / "missing"), *ports())
    assert code == 1
    assert "cannot read --admin-api-key-file" in error_line(stderr)
