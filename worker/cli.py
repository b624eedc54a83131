"""``leasehold worker run``: the worker agent on a scanning host.

Every flag has an environment variable ``LEASEHOLD_WORKER_<NAME>`` and a key of the same name in
the TOML file given by ``--config`` (or ``LEASEHOLD_WORKER_CONFIG``). Flags win over the
environment, which wins over the file.

Exit status: 0 after a graceful shutdown, 1 after a second signal or a crash, 2 for a
configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from leasehold.worker.settings import ENV_PREFIX, WorkerSettings

__all__ = ["main", "register"]

EXIT_CONFIG = 2

#: Fields whose flag differs from ``--field-name``.
_FLAG_NAMES = {"capabilities": "--capability"}
#: Placeholders in ``--help`` (default: the field name's last word).
_METAVARS = {"gateway": "URL", "cert": "FILE", "key": "FILE", "ca": "FILE", "max_concurrency": "N",
             "batch_records": "N", "log_level": "LEVEL", "acquire_many": "true|false"}


def register(subparsers: Any) -> None:
    """Add ``worker run`` to the ``leasehold`` command."""
    worker = subparsers.add_parser("worker", help="run the remote worker agent",
                                   description="The remote worker agent: leases tasks from the Gateway and "
                                               "runs scanner plugins.")
    sub = worker.add_subparsers(dest="worker_command", metavar="COMMAND", required=True)
    run = sub.add_parser(
        "run", help="lease tasks from the Gateway and run their plugins until SIGTERM/SIGINT",
        description="Long-poll the Gateway for tasks, run each task's plugin as a subprocess, renew its "
                    "lease, stream its results, obey cancellations. SIGTERM/SIGINT: stop acquiring, let "
                    "running plugins finish within --shutdown-grace-seconds, then exit 0; a second signal "
                    "exits at once.",
        epilog=f"Every option can also be set as {ENV_PREFIX}<NAME> in the environment or in the --config "
               "file; options win over the environment, which wins over the file.")
    add_arguments(run)
    run.set_defaults(func=run_command)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help=f"TOML file with settings (same names as the options, with _; "
                             f"env {ENV_PREFIX}CONFIG)")
    for name, field in WorkerSettings.model_fields.items():
        flag = _FLAG_NAMES.get(name, "--" + name.replace("_", "-"))
        env = ENV_PREFIX + name.upper()
        required = field.is_required()
        default = "" if required else f"; default {_default_text(field)}"
        help_text = f"{field.description} (env {env}{default})"
        if required:
            help_text = f"{field.description} (required; env {env})"
        if name == "capabilities":
            parser.add_argument(flag, dest=name, action="append", default=None, metavar="TASK_TYPE",
                                help=help_text)
        elif name == "log_format":
            parser.add_argument(flag, dest=name, choices=("text", "json"), default=None, help=help_text)
        else:
            metavar = _METAVARS.get(name, name.split("_")[-1].upper())
            parser.add_argument(flag, dest=name, default=None, metavar=metavar, help=help_text)


def _default_text(field: Any) -> str:
    if field.default_factory is not None:
        return "all"
    return "none" if field.default is None else str(field.default)


def settings_from_args(args: argparse.Namespace) -> WorkerSettings:
    """The settings from flags, environment and config file (raises ``ValueError`` / ``ValidationError``)."""
    overrides = {name: getattr(args, name) for name in WorkerSettings.model_fields
                 if getattr(args, name, None) is not None}
    config = args.config or (Path(os.environ[ENV_PREFIX + "CONFIG"]) if os.environ.get(ENV_PREFIX + "CONFIG")
                             else None)
    return WorkerSettings.load(config, **overrides)


def run_command(args: argparse.Namespace) -> int:
    """Handler of ``leasehold worker run``."""
    try:
        settings = settings_from_args(args)
        settings.check_files()
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "settings"
            print(f"leasehold: error: {where}: {error['msg']}", file=sys.stderr)
        return EXIT_CONFIG
    except ValueError as exc:
        print(f"leasehold: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return run(settings)


def run(settings: WorkerSettings) -> int:
    """Run the agent in this process until it is stopped by a signal; the exit status."""
    # Deferred: the agent pulls in aiohttp and TLS; `worker run --help` must start without them.
    from leasehold.protocol.logs import configure_logging
    from leasehold.worker.agent import Agent, ConfigurationError
    from leasehold.worker.status import LogStatusView, RichStatusView, Status

    status = Status(settings.max_concurrency)
    console = None
    if settings.log_format == "text" and sys.stderr.isatty():
        from rich.console import Console  # deferred: rich only for a text log on a terminal

        console = Console(stderr=True)
    configure_logging(settings.log_format, settings.log_level, rich_console=console)
    agent = Agent(settings, status=status)

    async def main() -> int:
        if console is not None:
            with RichStatusView(status, console):
                return await agent.run(handle_signals=True)
        LogStatusView(status)
        return await agent.run(handle_signals=True)

    try:
        return asyncio.run(main())
    except ConfigurationError as exc:
        print(f"leasehold: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG


def main(argv: list[str] | None = None) -> int:
    """``python -m leasehold.worker.cli run …`` (the same as ``leasehold worker run …``)."""
    parser = argparse.ArgumentParser(prog="leasehold worker")
    sub = parser.add_subparsers(dest="worker_command", metavar="COMMAND", required=True)
    run_parser = sub.add_parser("run", help="run the worker agent")
    add_arguments(run_parser)
    run_parser.set_defaults(func=run_command)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
