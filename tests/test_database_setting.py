"""Every command that touches a database reads the same setting, names the database on stderr,
and never falls back to the embedded server unless asked (``--embedded``).

Each command runs as a real subprocess with ``LEASEHOLD_HOME`` in a scratch directory, so an
embedded server started behind our back would leave its data directory there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from leasehold.cli.main import main
from leasehold.gateway.tls import PkiPaths
from leasehold.migrations import runner as migrate
from leasehold.persistence.urls import database_label

#: Every command that works on a database, with arguments that make it finish quickly.
COMMANDS: dict[str, tuple[str, ...]] = {
    "migrate": ("migrate",),
    "migrate status": ("migrate", "status"),
    "migrate check": ("migrate", "check"),
    "replay verify": ("replay", "verify", "--no-progress"),
    "replay verify-chain": ("replay", "verify-chain", "--no-progress"),
    "replay timeline": ("replay", "timeline", "00000000-0000-0000-0000-000000000001"),
    "replay checkpoint": ("replay", "checkpoint"),
    "admin create-key": ("admin", "create-key"),
    "admin list-keys": ("admin", "list-keys"),
    "partitions list": ("partitions", "list"),
    "partitions ensure": ("partitions", "ensure"),
    "retention run": ("retention", "run", "--older-than", "90d", "--out", "never-written"),
    "legacy drain": ("legacy", "drain", "--redis-url", "redis://127.0.0.1:1/0", "--queue", "q"),
    "gateway serve": ("gateway", "serve", "--worker-port", "0", "--operator-port", "0"),
}


def environment(home: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    found = {k: v for k, v in os.environ.items() if not k.endswith("DATABASE_URL")}
    found.update({"LEASEHOLD_HOME": str(home), "LEASEHOLD_LOG_LEVEL": "WARNING", **(env or {})})
    return found


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> object:
    """``cli(*args, env={...}) -> (exit code, stdout, stderr)`` of ``leasehold ARGS`` in this
    process, with only ``env``'s database variables set and ``LEASEHOLD_HOME`` = tmp_path."""
    def call(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        return run_all(tmp_path, {"it": list(args)}, env or {}, monkeypatch, capsys)["it"]
    return call


def run_all(home: Path, commands: dict[str, list[str]], env: dict[str, str],
            monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> dict[str, tuple[int, str, str]]:
    """Run the commands; name -> (exit code, stdout, stderr). ``gateway serve`` (which sets up
    the process's logging) runs as a subprocess, meanwhile the others run in this process, with
    the same environment."""
    serving = None
    if "gateway serve" in commands:
        serving = subprocess.Popen([sys.executable, "-m", "leasehold.cli.main", *commands["gateway serve"]],
                                   env=environment(home, env), cwd=home, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
    for name in [k for k in os.environ if k.endswith("DATABASE_URL")]:
        monkeypatch.delenv(name)
    for name, value in {"LEASEHOLD_HOME": str(home), **env}.items():
        monkeypatch.setenv(name, value)
    done = {}
    capsys.readouterr()
    for name, args in commands.items():
        if name != "gateway serve":
            code = main(args)
            out, err = capsys.readouterr()
            done[name] = (code, out, err)
    if serving is not None:
        out, err = serving.communicate(timeout=60)
        done["gateway serve"] = (serving.returncode, out, err)
    return done


def no_embedded_server(home: Path) -> None:
    assert not (home / ".leasehold").exists(), "an embedded server was started"


def with_pki(pki: PkiPaths) -> dict[str, list[str]]:
    return {name: [*args, *(("--pki-dir", str(pki.directory)) if name == "gateway serve" else ())]
            for name, args in COMMANDS.items()}


def test_without_a_database_setting_nothing_is_guessed(tmp_path: Path, pki: PkiPaths, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    for name, (code, _, err) in run_all(tmp_path, with_pki(pki), {}, monkeypatch, capsys).items():
        assert code == 2, (name, err)
        assert "no database: set --database-url or LEASEHOLD_DATABASE_URL" in err, name
        assert "Traceback" not in err, name
    no_embedded_server(tmp_path)


@pytest.mark.parametrize("variable", ["LEASEHOLD_DATABASE_URL", "DATABASE_URL", "--database-url"])
def test_every_command_reads_the_same_setting(variable: str, tmp_path: Path, pki: PkiPaths,
                                              empty_database_url: str, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Each command names the database set, and reaches it: an unmigrated one, which every
    command but ``migrate`` refuses (never an "OK") and ``migrate`` then migrates."""
    commands = with_pki(pki)
    env = {}
    if variable == "--database-url":
        commands = {name: [*args, "--database-url", empty_database_url] for name, args in commands.items()}
    else:
        env[variable] = empty_database_url
    migrate_args = commands.pop("migrate")
    results = run_all(tmp_path, commands, env, monkeypatch, capsys)
    results["migrate"] = run_all(tmp_path, {"migrate": migrate_args}, env, monkeypatch, capsys)["migrate"]
    for name, (code, out, err) in results.items():
        assert f"leasehold: database {database_label(empty_database_url)}" in err.splitlines(), (name, err)
        assert "Traceback" not in err, name
        if name == "migrate":
            assert code == 0, err
        elif name == "migrate status":
            assert code == 0 and "not migrated" in out, (out, err)
        else:
            assert code != 0, (name, out)  # an unmigrated database is refused
            assert "OK" not in out, name
    assert migrate.current(empty_database_url) == migrate.head()
    no_embedded_server(tmp_path)


def test_the_command_line_wins_over_the_environment(cli: Any, empty_database_url: str) -> None:
    code, _, err = cli("migrate", "--database-url", empty_database_url,
                       env={"LEASEHOLD_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/elsewhere",
                            "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/elsewhere"})
    assert code == 0, err
    assert migrate.current(empty_database_url) == migrate.head()


def test_leasehold_database_url_wins_over_database_url(cli: Any, empty_database_url: str) -> None:
    code, _, err = cli("migrate", env={"LEASEHOLD_DATABASE_URL": empty_database_url,
                                       "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/elsewhere"})
    assert code == 0, err
    assert migrate.current(empty_database_url) == migrate.head()


def test_embedded_and_a_url_exclude_each_other(cli: Any, tmp_path: Path, empty_database_url: str) -> None:
    code, _, err = cli("migrate", "--embedded", "--database-url", empty_database_url)
    assert code == 2 and "exclude each other" in err
    no_embedded_server(tmp_path)


@pytest.mark.parametrize("action", ["verify", "verify-chain"])
def test_replay_verify_of_an_empty_log_is_not_ok(action: str, cli: Any, database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM events").fetchone() == (0,)
    code, out, _ = cli("replay", action, "--no-progress", env={"LEASEHOLD_DATABASE_URL": database_url})
    assert code == 1
    assert out.startswith("EMPTY:") and "nothing was verified" in out


def test_replay_of_an_unmigrated_database_says_so(cli: Any, empty_database_url: str) -> None:
    code, _, err = cli("replay", "verify", "--no-progress", "--database-url", empty_database_url)
    assert code == 1
    assert "is not a leasehold database (never migrated)" in err


@pytest.mark.parametrize("action", [("verify", "--no-progress"), ("rebuild", "--no-progress", "--schema", "rebuilt")])
def test_replay_names_its_database_once(action: tuple[str, ...], cli: Any, database_url: str) -> None:
    """Replay's commands open several connections; the database is named in one line all the same."""
    _, _, err = cli("replay", *action, env={"LEASEHOLD_DATABASE_URL": database_url})
    assert err.splitlines().count(f"leasehold: database {database_label(database_url)}") == 1, err


@pytest.mark.parametrize("command", ["admin list-keys", "partitions list", "partitions ensure", "retention run"])
def test_a_database_never_migrated_is_said_to_be_one(command: str, cli: Any, empty_database_url: str) -> None:
    """Not the first missing table's SQL error: one line that names the cause and exit 1."""
    code, _, err = cli(*COMMANDS[command], env={"LEASEHOLD_DATABASE_URL": empty_database_url})
    errors = [line for line in err.splitlines() if line.startswith("leasehold: error:")]
    assert code == 1, err
    assert errors == [f"leasehold: error: {database_label(empty_database_url)} is not a leasehold database "
                      "(never migrated): run `leasehold migrate`, or check --database-url / LEASEHOLD_DATABASE_URL"], err
    assert len(err.splitlines()) == 2, err  # the database named, then the error
