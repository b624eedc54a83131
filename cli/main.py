"""The ``leasehold`` console command.

Subcommands come from the modules listed in :data:`SUBCOMMAND_MODULES` (the dispatch table).
Each module exposes ``register(subparsers)``, which adds its parser(s) and sets a handler with
``parser.set_defaults(func=handler)``; ``handler(args: argparse.Namespace) -> int`` returns the
exit code. To add a command, write such a module and append its dotted name below.

Exit codes: 0 success, 1 failure (unreachable database, failed migration, ...), 2 usage error.
Handlers report expected failures by raising :class:`CommandError`; database driver errors that
escape a handler are reported the same way, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from cli.embedded import EmbeddedPostgresError

__all__ = ["SUBCOMMAND_MODULES", "CommandError", "build_parser", "main"]

#: Dispatch table: modules whose ``register(subparsers)`` contributes subcommands, in help order.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "cli.database",  # migrate, db start|stop|status|url
    "cli.pki",  # pki init|issue-worker
    "cli.replay",  # replay timeline|rebuild|verify|as-of|verify-chain|checkpoint|export|verify-bundle
    "cli.gateway",  # gateway serve
    "cli.admin",  # admin create-key
    "cli.legacy",  # legacy drain
    "worker.cli",  # worker run
    "cli.demo",  # demo
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class CommandError(Exception):
    """An expected failure: printed as ``leasehold: error: <message>``, exits with ``exit_code``."""
    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _version() -> str:
    try:
        return version("leasehold")
    except PackageNotFoundError:
        return "unknown"


def build_parser(modules: Sequence[str] = SUBCOMMAND_MODULES) -> argparse.ArgumentParser:
    """Build the ``leasehold`` argument parser from the subcommand modules in ``modules``."""
    parser = argparse.ArgumentParser(
        prog="leasehold",
        description="Durable, event-sourced task lifecycle for remote scanner workers.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more (-v: info, -vv: debug) to stderr"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in modules:
        module = importlib.import_module(name)
        module.register(subparsers)
    return parser


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _database_error_message(exc: BaseException) -> str | None:
    """Return a one-paragraph message for driver/SQLAlchemy/embedded-server errors, else ``None``."""
    if isinstance(exc, EmbeddedPostgresError):
        return str(exc)
    module = type(exc).__module__
    if module.startswith(("psycopg", "sqlalchemy")):
        orig: Any = getattr(exc, "orig", None)  # SQLAlchemy wraps the driver's exception
        return str(orig if orig is not None else exc).strip()
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``leasehold`` command line; return the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(func(args))
    except CommandError as exc:
        print(f"leasehold: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("leasehold: interrupted", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as exc:
        message = _database_error_message(exc)
        if message is None:
            raise
        print(f"leasehold: error: {message}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    from cli.main import main as _main  # same CommandError class as the subcommand modules

    sys.exit(_main())
