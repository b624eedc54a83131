"""The command line's manners: a description for every command, no "default None", ``--no-x``
flags, no secret on the command line, one-line errors, exit code 2 for usage errors."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from leasehold.cli.main import build_parser, main


def parsers(parser: argparse.ArgumentParser, name: str = "leasehold") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from parsers(sub, f"{name} {sub_name}")


def test_every_command_has_a_description_and_no_none_in_its_help() -> None:
    found = list(parsers(build_parser()))
    assert len(found) > 25
    for name, parser in found:
        assert parser.description, name
        text = parser.format_help()
        assert "None" not in text, (name, [line for line in text.splitlines() if "None" in line])


def test_switches_are_flags_and_secrets_are_not_options() -> None:
    serve = dict(parsers(build_parser()))["leasehold gateway serve"]
    options = {o for action in serve._actions for o in action.option_strings}
    assert {"--listen", "--no-listen", "--admin-api-key-file"} <= options
    assert "--admin-api-key" not in options
    with pytest.raises(SystemExit) as exc:
        main(["gateway", "serve", "--admin-api-key", "s3cret"])
    assert exc.value.code == 2


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["migrate", "sideways"])
    assert exc.value.code == 2
    assert main(["migrate", "downgrade", "--database-url", "postgresql://127.0.0.1:1/x"]) == 2
    assert "needs --revision" in capsys.readouterr().err


def test_file_and_unexpected_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["pki", "init", str(blocker / "pki")]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("leasehold: error: ") and "Traceback" not in err

    from leasehold.cli import database as cli_database

    def broken(args: argparse.Namespace) -> int:
        raise RuntimeError("something no one expected")

    monkeypatch.setattr(cli_database, "_migrate", broken)
    assert main(["migrate", "--database-url", "postgresql://127.0.0.1:1/x"]) == 1
    err = capsys.readouterr().err
    assert err == ("leasehold: error: unexpected RuntimeError: something no one expected "
                   "(run with -vv for the traceback)\n")
    with pytest.raises(RuntimeError):
        main(["-vv", "migrate", "--database-url", "postgresql://127.0.0.1:1/x"])


def test_the_bootstrap_key_comes_from_its_file(tmp_path: Path) -> None:
    from leasehold.gateway.settings import GatewaySettings

    key_file = tmp_path / "admin-key"
    key_file.write_text("k3y-from-a-file\n")
    assert GatewaySettings(admin_api_key_file=key_file).bootstrap_key() == "k3y-from-a-file"
    assert GatewaySettings(admin_api_key="from-env", admin_api_key_file=key_file).bootstrap_key() == "from-env"
    assert GatewaySettings().bootstrap_key() is None


def test_a_reader_that_stops_early_is_no_error() -> None:
    """``leasehold migrate --sql | head``: the pipe's reader is gone before the output is; the
    command stops without an error line (exit 1, as for any output it could not finish)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone: every write to the pipe fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "leasehold.cli.main", "migrate", "--sql"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60,
                              env={k: v for k, v in os.environ.items() if not k.endswith("DATABASE_URL")})
    finally:
        os.close(write_end)
    assert done.returncode == 1, done.stderr
    assert done.stderr == "", done.stderr
