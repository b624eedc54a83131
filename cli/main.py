"""The ``leasehold`` console command.

Subcommands come from the modules listed in :data:`SUBCOMMAND_MODULES` (the dispatch table).
Each module exposes ``register(subparsers)``, which adds its parser(s) and sets a handler with
``parser.set_defaults(func=handler)``; ``handler(args: argparse.Namespace) -> int`` returns the
exit code. To add a command, write such a module and append a :class:`CommandModule` below with
the names and one-line helps its ``register`` gives the top-level parser.

Only the module of the command being run is imported. The table repeats each command's one-line
help so that ``leasehold --help`` lists every command without importing any of them: a worker
host runs ``leasehold worker run`` without the server's packages installed (the ``server``
extra), and does not pay for importing them on a host that has them. Running a server command
where the ``server`` extra is missing prints one line saying so.

Exit codes: 0 success, 1 failure (unreachable database, failed migration, missing ``server``
extra, ...), 2 usage error. Handlers report expected failures by raising :class:`CommandError`;
database driver errors, file errors and anything unexpected that escapes a handler are reported
the same way, in one line without a traceback (``-vv`` shows the traceback of an unexpected one).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SUBCOMMAND_MODULES", "CommandError", "CommandModule", "build_parser", "main"]


@dataclass(frozen=True)
class CommandModule:
    """A module of the dispatch table and the top-level commands its ``register`` adds."""

    #: Dotted name of the module exposing ``register(subparsers)``.
    module: str
    #: ``(command, one-line help)`` of each command it registers, in help order; the help must be
    #: the one ``register`` passes to ``add_parser`` (a test compares them).
    commands: tuple[tuple[str, str], ...]
    #: Whether it needs the ``server`` extra (everything but the worker agent does).
    needs_server: bool = True


#: Dispatch table: modules whose ``register(subparsers)`` contributes subcommands, in help order.
SUBCOMMAND_MODULES: tuple[CommandModule, ...] = (
    CommandModule("leasehold.cli.database", (("migrate", "upgrade the database schema (alembic)"),
                                   ("db", "manage the embedded PostgreSQL server"))),
    CommandModule("leasehold.cli.pki", (("pki", "manage the Gateway's mTLS certificate authority"),)),
    CommandModule("leasehold.cli.replay", (
        ("replay", "audit the event log: timelines, rebuild, verify, as-of, checkpoints, export"),)),
    CommandModule("leasehold.cli.seal", (("seal", "signed seals of the event log: the signing key, a seal on demand"),)),
    CommandModule("leasehold.cli.retention", (
        ("partitions", "the event log's time partitions: list them, create them ahead"),
        ("retention", "archive old partitions of the event log as signed bundles, then drop them"))),
    CommandModule("leasehold.cli.gateway", (("gateway", "run the Gateway"),)),
    CommandModule("leasehold.cli.admin", (("admin", "operator administration (API keys, target policies, fair shares)"),)),
    CommandModule("leasehold.cli.operator", (
        ("organizations", "create, list and show organisations; target policy, fair share, admission (operator API)"),
        ("keys", "create, list, revoke and rotate API keys (operator API, administrator)"),
        ("workers", "register, assign, change, disable and list workers (operator API)"),
        ("scans", "create, list, show and cancel scans (operator API)"),
        ("tasks", "list, show, retry and cancel tasks; their history (operator API)"),
        ("bulk", "cancel or retry every task a filter selects, tracked (operator API)"),
        ("webhooks", "notifications to an organisation's URLs, signed: subscribe, deliveries, redeliver (operator API)"),
        ("profiles", "stored scan profiles: create, list, show, replace, delete (operator API)"),
        ("schedules", "scheduled scans: create, list, show, pause, resume, run now, delete (operator API)"),
        ("counts", "tasks by state, scans by status and queues per organisation (operator API)"),
    ), needs_server=False),
    CommandModule("leasehold.cli.legacy", (("legacy", "the legacy Redis scan queue (moving it to the Gateway)"),)),
    CommandModule("leasehold.worker.cli", (("worker", "run the remote worker agent"),), needs_server=False),
    CommandModule("leasehold.cli.demo", (("demo", "run the end-to-end demo (what `make demo` runs)"),)),
)

#: This project's own package: a missing module of it is a broken install, not a missing extra.
_OWN_PACKAGES = frozenset({"leasehold"})

_SERVER_EXTRA_HINT = "pip install 'leasehold[server]'"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class CommandError(Exception):
    """An expected failure: printed as ``leasehold: error: <message>``, exits with ``exit_code``."""
    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _VersionAction(argparse._VersionAction):
    """``--version``, reading the installed version only when asked: the metadata lookup would
    otherwise cost every command (``leasehold worker run`` included) tens of milliseconds."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        self.version = f"%(prog)s {_version()}"
        super().__call__(parser, namespace, values, option_string)


def _version() -> str:
    # Deferred: importlib.metadata (with zipfile and email) is most of what `leasehold --help` imports.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("leasehold")
    except PackageNotFoundError:
        return "unknown"


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """Build the ``leasehold`` argument parser.

    The modules of ``commands`` (every module when ``None``) are imported and register their real
    parsers; every other command is a placeholder that only lists its name and one-line help, so
    the top-level help and usage errors read the same either way. Raises :class:`CommandError`
    when a module needs the ``server`` extra and it is not installed.
    """
    parser = argparse.ArgumentParser(
        prog="leasehold",
        description="Durable, event-sourced task lifecycle for remote scanner workers.",
    )
    parser.add_argument("--version", action=_VersionAction, version="%(prog)s")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more (-v: info, -vv: debug) to stderr"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for entry in SUBCOMMAND_MODULES:
        chosen = [name for name, _ in entry.commands if commands is None or name in commands]
        if chosen:
            _import_command_module(entry, chosen[0]).register(subparsers)
        else:
            for name, help_text in entry.commands:
                # No options of its own: while choosing the command, everything after it is left
                # for the real parser (see main()).
                subparsers.add_parser(name, help=help_text, add_help=False)
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """Every (sub)command's ``--help`` opens with a description: its one-line help where it was
    given no longer one."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help for choice in action._choices_actions}
        for name, sub in action.choices.items():
            if sub.description is None and helps.get(name):
                text = str(helps[name])
                sub.description = text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")
            _describe(sub)


def _import_command_module(entry: CommandModule, command: str) -> Any:
    """Import ``entry.module``; a missing third-party package of a server command is a missing
    ``server`` extra, reported in one line rather than with a traceback."""
    try:
        return importlib.import_module(entry.module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if not entry.needs_server or not missing or missing in _OWN_PACKAGES:
            raise
        raise CommandError(f"`leasehold {command}` needs the server extra, which is not installed "
                           f"(no module named {missing!r}): {_SERVER_EXTRA_HINT}") from exc


def _chosen_command(argv: Sequence[str] | None) -> str | None:
    """The command named on the command line, found by the top-level parser alone.

    Top-level options and usage errors (an unknown command) are handled here exactly as the full
    parser would: ``--help``/``--version`` print and exit, a bad command exits 2.
    """
    known, _ = build_parser(commands=()).parse_known_args(argv)
    command: str | None = known.command
    return command


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _database_error_message(exc: BaseException) -> str | None:
    """Return a one-paragraph message for driver/SQLAlchemy/embedded-server errors, else ``None``."""
    # An EmbeddedPostgresError can only come from an imported cli.embedded; looking it up rather
    # than importing it keeps the module (and its start-up cost) out of commands that never use it.
    embedded = sys.modules.get("leasehold.cli.embedded")
    if embedded is not None and isinstance(exc, embedded.EmbeddedPostgresError):
        return str(exc)
    module = type(exc).__module__
    if module.startswith(("psycopg", "sqlalchemy")):
        orig: Any = getattr(exc, "orig", None)  # SQLAlchemy wraps the driver's exception
        return str(orig if orig is not None else exc).strip()
    return None


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has closed it (its write end then polls POLLERR)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``leasehold`` command line; return the process exit code."""
    command = _chosen_command(argv)
    try:
        parser = build_parser(commands=() if command is None else (command,))
    except CommandError as exc:
        print(f"leasehold: error: {exc}", file=sys.stderr)
        return exc.exit_code
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(func(args))
    except CommandError as exc:
        print(f"leasehold: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("leasehold: interrupted", file=sys.stderr)
        return EXIT_FAILURE
    except BrokenPipeError as exc:
        if not _stdout_closed():
            print(f"leasehold: error: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_FAILURE
        # The reader of stdout went away (``leasehold … | head``): nothing to say, and nobody to
        # say it to; stdout goes to /dev/null so that the interpreter's last flush stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_FAILURE
    except Exception as exc:
        message = _database_error_message(exc)
        if message is None and isinstance(exc, OSError) and exc.strerror:
            message = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
        if message is None:
            if args.verbose >= 2:
                raise
            message = f"unexpected {type(exc).__name__}: {exc} (run with -vv for the traceback)"
        print(f"leasehold: error: {' '.join(message.split())}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    from leasehold.cli.main import main as _main  # same CommandError class as the subcommand modules

    sys.exit(_main())
