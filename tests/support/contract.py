"""The public contract as committed snapshots: the Gateway's OpenAPI document
(``docs/openapi.json``) and the help text of every ``leasehold`` command (``docs/cli/``).

The snapshot tests (tests/unit/test_contract_snapshots.py, and tests/api/test_openapi_document.py
for the document a running Gateway serves) compare the code with these files, so a change to the
HTTP API or the CLI shows up in review as a diff of them. After an intended change, rewrite them
with ``make openapi`` / ``make cli-help`` (``python -m support.contract openapi|cli-help`` with
``tests`` on the path) and commit the result.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from leasehold.cli.main import build_parser
from leasehold.gateway.api.openapi import build_openapi
from leasehold.gateway.app import create_app
from leasehold.gateway.keys import ROUTES
from leasehold.gateway.settings import GatewaySettings

ROOT = Path(__file__).resolve().parents[2]
OPENAPI_FILE = ROOT / "docs" / "openapi.json"
CLI_HELP_DIR = ROOT / "docs" / "cli"
#: The terminal width help is rendered for (argparse wraps to ``$COLUMNS``).
HELP_COLUMNS = "80"


def render_openapi(document: dict[str, Any]) -> str:
    """The committed form: pretty-printed, keys sorted, one trailing newline."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def openapi_from_code() -> dict[str, Any]:
    """The document the Gateway serves, built from the route tables of an application that is
    created but never started (no database, no sockets)."""
    return build_openapi(create_app(GatewaySettings())[ROUTES])


@contextmanager
def help_width() -> Iterator[None]:
    """Render help as a ``COLUMNS=80`` terminal would, whatever this one is."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def _commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for sub in action.choices.values():  # an alias maps to the same parser: once
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from _commands(sub)


def help_file_name(prog: str) -> str:
    """``leasehold replay as-of`` -> ``leasehold_replay_as-of.txt``."""
    return prog.replace(" ", "_") + ".txt"


def cli_help_from_code() -> dict[str, str]:
    """``{file name: text}``: what ``leasehold … --help`` prints, for every command and group.

    argparse's ``format_help`` of the parser ``cli.main.build_parser`` builds is exactly what
    ``--help`` prints (a test checks that against real subprocesses), so one import does for all.
    """
    with help_width():
        return {help_file_name(p.prog): p.format_help() for p in _commands(build_parser())}


def committed_cli_help() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(CLI_HELP_DIR.glob("*.txt"))}


def difference(committed: str, current: str, name: str, target: str) -> str:
    """A readable failure: the unified diff and how to accept the change."""
    lines = difflib.unified_diff(committed.splitlines(keepends=True), current.splitlines(keepends=True),
                                 fromfile=f"{name} (committed)", tofile=f"{name} (from the code)")
    return (f"{name} differs from the code. If the change is intended, run `make {target}` and commit "
            f"the result.\n" + "".join(lines))


def write_openapi() -> None:
    OPENAPI_FILE.parent.mkdir(parents=True, exist_ok=True)
    OPENAPI_FILE.write_text(render_openapi(openapi_from_code()))
    print(f"wrote {OPENAPI_FILE.relative_to(ROOT)}")


def write_cli_help() -> None:
    CLI_HELP_DIR.mkdir(parents=True, exist_ok=True)
    texts = cli_help_from_code()
    for stale in set(committed_cli_help()) - set(texts):
        (CLI_HELP_DIR / stale).unlink()
    for name, text in texts.items():
        (CLI_HELP_DIR / name).write_text(text)
    print(f"wrote {len(texts)} files to {CLI_HELP_DIR.relative_to(ROOT)}/")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.contract", description=__doc__.split("\n\n")[0])
    parser.add_argument("snapshot", choices=("openapi", "cli-help"))
    args = parser.parse_args(argv)
    (write_openapi if args.snapshot == "openapi" else write_cli_help)()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
