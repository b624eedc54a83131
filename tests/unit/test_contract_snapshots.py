"""The HTTP API's OpenAPI document and every ``leasehold --help`` text are what the committed
snapshots in docs/ say (see :mod:`support.contract`; ``make openapi`` / ``make cli-help`` rewrite
them). The document a running Gateway serves is compared in tests/api/test_openapi_document.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.contract import (
    CLI_HELP_DIR,
    HELP_COLUMNS,
    OPENAPI_FILE,
    cli_help_from_code,
    committed_cli_help,
    difference,
    help_file_name,
    openapi_from_code,
    render_openapi,
)

CURRENT_HELP = cli_help_from_code()
COMMITTED_HELP = committed_cli_help()
LEASEHOLD = Path(sys.executable).with_name("leasehold")


def test_the_openapi_document_of_the_route_tables_is_the_committed_one() -> None:
    current, committed = render_openapi(openapi_from_code()), OPENAPI_FILE.read_text()
    assert current == committed, difference(committed, current, "docs/openapi.json", "openapi")


def test_every_command_has_a_committed_help_text_and_no_other() -> None:
    missing, stale = sorted(set(CURRENT_HELP) - set(COMMITTED_HELP)), sorted(set(COMMITTED_HELP) - set(CURRENT_HELP))
    assert (missing, stale) == ([], []), (
        f"commands without a help snapshot: {missing}; snapshots of no command: {stale}. "
        "Run `make cli-help` and commit docs/cli/.")


@pytest.mark.parametrize("name", sorted(set(CURRENT_HELP) & set(COMMITTED_HELP)))
def test_the_help_text_is_the_committed_one(name: str) -> None:
    assert CURRENT_HELP[name] == COMMITTED_HELP[name], difference(
        COMMITTED_HELP[name], CURRENT_HELP[name], f"docs/cli/{name}", "cli-help")


@pytest.mark.parametrize("command", [[], ["replay", "as-of"]])
def test_the_snapshots_are_what_the_installed_command_prints(command: list[str]) -> None:
    """The snapshots come from argparse's ``format_help`` in this process; ``--help`` in a real
    process, at the same width, prints the very same text."""
    printed = subprocess.run([str(LEASEHOLD), *command, "--help"], capture_output=True, text=True, check=True,
                             env={**os.environ, "COLUMNS": HELP_COLUMNS}, timeout=60).stdout
    name = help_file_name(" ".join(["leasehold", *command]))
    assert printed == (CLI_HELP_DIR / name).read_text()
