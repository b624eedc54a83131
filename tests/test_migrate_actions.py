"""``leasehold migrate status|check|history|downgrade|--sql`` and the refusal to go back by upgrade."""

from __future__ import annotations

import psycopg
import pytest

from leasehold.cli.main import main
from leasehold.migrations import runner as migrate
from leasehold.persistence.urls import database_label


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_status_and_check_of_an_unmigrated_then_migrated_database(
        empty_database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    head = migrate.head()
    code, out, err = run(capsys, "migrate", "status", "--database-url", empty_database_url)
    assert code == 0 and "never migrated" in out and f"expects {head}" in out
    assert err.strip() == f"leasehold: database {database_label(empty_database_url)}"
    code, _, err = run(capsys, "migrate", "check", "--database-url", empty_database_url)
    assert code == 1 and "not migrated" in err
    assert run(capsys, "migrate", "--database-url", empty_database_url)[0] == 0
    code, out, _ = run(capsys, "migrate", "check", "--database-url", empty_database_url)
    assert code == 0 and out.strip().endswith(f"at revision {head} (head)")
    code, out, _ = run(capsys, "migrate", "status", "--database-url", empty_database_url)
    assert code == 0 and out.strip().endswith("up to date")


def test_check_of_a_database_behind(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    previous = migrate.revisions()[-2]
    migrate.downgrade(database_url, previous)
    code, _, err = run(capsys, "migrate", "check", "--database-url", database_url)
    assert code == 1 and f"at revision {previous}" in err and "1 migration pending" in err


def test_upgrade_to_an_older_revision_is_refused_and_changes_nothing(
        database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    older = migrate.revisions()[-3]
    code, _, err = run(capsys, "migrate", "--revision", older, "--database-url", database_url)
    assert code == 1
    assert "upgrade never goes back" in err and f"leasehold migrate downgrade --revision {older}" in err
    assert migrate.current(database_url) == migrate.head()


def test_downgrade_goes_back_and_says_so(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    older = migrate.revisions()[-2]
    code, out, err = run(capsys, "migrate", "downgrade", "--revision", older, "--database-url", database_url)
    assert code == 0 and f"downgraded from {migrate.head()} to {older}" in err
    assert migrate.current(database_url) == older
    assert run(capsys, "migrate", "downgrade", "--database-url", database_url)[0] == 2  # needs --revision


def test_history_lists_every_revision_and_marks_head_and_current(
        database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "migrate", "history", "--database-url", database_url)
    lines = out.splitlines()
    assert code == 0 and [line.split()[0] for line in lines] == migrate.revisions()
    assert lines[-1].endswith("(head, current)")


def test_sql_prints_the_migrations_without_a_database(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("LEASEHOLD_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = run(capsys, "migrate", "--sql")
    assert code == 0 and err == ""
    assert "CREATE TABLE organizations" in out and f"version_num='{migrate.head()}'" in out
    head, previous = migrate.revisions()[-1], migrate.revisions()[-2]
    code, out, _ = run(capsys, "migrate", "downgrade", "--sql", "--revision", previous)
    assert code == 0 and f"Running downgrade {head} -> {previous}" in out
    assert f"SET version_num='{previous}'" in out and "CREATE TABLE organizations" not in out  # that step only


def test_sql_upgrade_runs_as_printed(empty_database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The printed SQL is the migration: run by psql's equivalent it reaches head."""
    code, out, _ = run(capsys, "migrate", "--sql")
    assert code == 0
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(out.encode())
    assert migrate.current(empty_database_url) == migrate.head()
