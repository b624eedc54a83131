"""``leasehold`` CLI: migrate and error handling (exit codes 0/1/2, no tracebacks)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from leasehold.cli.main import main
from leasehold.migrations import runner as migrate
from leasehold.persistence.urls import database_label


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_migrate_upgrades_to_head(empty_database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", "--database-url", empty_database_url]) == 0
    out = capsys.readouterr().out
    head = migrate.head()
    assert migrate.current(empty_database_url) == head
    assert out.strip().endswith(f"at revision {head} (head)" if head else "at revision base")


def test_migrate_uses_database_url_env(
    empty_database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", empty_database_url)
    assert main(["migrate"]) == 0
    assert migrate.current(empty_database_url) == migrate.head()
    assert database_label(empty_database_url) in capsys.readouterr().out


def test_migrate_unreachable_database_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"postgresql://postgres:hunter2@127.0.0.1:{_closed_port()}/nowhere"
    assert main(["migrate", "--database-url", url]) == 1
    captured = capsys.readouterr()
    assert "leasehold: error: cannot connect to database at 127.0.0.1:" in captured.err
    assert "hunter2" not in captured.err and "Traceback" not in captured.err


def test_migrate_unknown_revision(empty_database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", "--database-url", empty_database_url, "--revision", "nope"]) == 1
    assert "migration failed" in capsys.readouterr().err


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["migrate", "--database-url", "mysql://x/y"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["db"])
    assert exc.value.code == 2


def test_db_status_of_missing_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "status", "--data-dir", str(tmp_path / "pgdata")]) == 1
    assert capsys.readouterr().out.startswith("not running")
    assert main(["db", "stop", "--data-dir", str(tmp_path / "pgdata")]) == 0
