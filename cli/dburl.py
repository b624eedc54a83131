"""The one database setting of every ``leasehold`` command that touches a database.

The database is ``--database-url``, else ``$LEASEHOLD_DATABASE_URL``, else ``$DATABASE_URL``.
Without any of them a command refuses (exit 2) rather than guess: the embedded development
server is used only when asked for with ``--embedded`` (``leasehold demo`` and the test suite
ask for it themselves). The command names the database it works on (host, port, database,
user; never the password) in one line on stderr before it starts.
"""

from __future__ import annotations

import argparse
import os
import sys

from leasehold.cli.main import EXIT_USAGE, CommandError

__all__ = ["DATABASE_ENV", "add_database_options", "announce", "check_migrated", "configured_url",
           "resolve_database_url"]

#: Environment variables read, in order, when ``--database-url`` is not given.
DATABASE_ENV = ("LEASEHOLD_DATABASE_URL", "DATABASE_URL")

_URL_HELP = "PostgreSQL URL, postgresql://USER@HOST:PORT/DB (else $LEASEHOLD_DATABASE_URL, else $DATABASE_URL)"
_EMBEDDED_HELP = "use the embedded development PostgreSQL under .leasehold/ instead (never for production)"


def add_database_options(parser: argparse.ArgumentParser, *, url: bool = True) -> None:
    """``--database-url URL`` (unless ``url=False``: the command reads it from its own settings)
    and ``--embedded``."""
    if url:
        parser.add_argument("--database-url", metavar="URL", help=_URL_HELP)
    parser.add_argument("--embedded", action="store_true", help=_EMBEDDED_HELP)


def configured_url(explicit: str | None = None) -> str | None:
    """``explicit``, else the first of :data:`DATABASE_ENV` that is set, else ``None``."""
    if explicit:
        return explicit
    for name in DATABASE_ENV:
        value = os.environ.get(name)
        if value:
            return value
    return None


def resolve_database_url(explicit: str | None = None, *, embedded: bool = False, quiet: bool = False) -> str:
    """The database a command works on (see the module's docstring), announced on stderr.

    ``embedded=True`` (``--embedded``) starts or reuses the embedded server and ignores the
    environment; it is a usage error together with an explicit ``--database-url``.
    """
    if embedded:
        if explicit:
            raise CommandError("--embedded and --database-url exclude each other", EXIT_USAGE)
        from leasehold.cli.embedded import embedded_database_url

        url = embedded_database_url()
    else:
        found = configured_url(explicit)
        if found is None:
            raise CommandError("no database: set --database-url or LEASEHOLD_DATABASE_URL (or DATABASE_URL); "
                               "--embedded uses the embedded development server", EXIT_USAGE)
        url = found
    if not quiet:
        announce(url)
    return url


def check_migrated(url: str, timeout: int = 10) -> None:
    """One plain connection, so that an unreachable database is one clear line at once rather
    than a pool's retries; and a database that was never migrated is said to be one, rather than
    left to fail on the first table it lacks."""
    import psycopg

    from leasehold.persistence.queries import QUERIES
    from leasehold.persistence.urls import database_label

    try:
        with psycopg.connect(url, connect_timeout=timeout) as conn:
            row = conn.execute(QUERIES["schema_migrated"]).fetchone()
    except psycopg.Error as exc:
        raise CommandError(f"cannot connect to the database at {database_label(url)}: "
                           f"{' '.join(str(exc).split())}") from exc
    if not (row and row[0]):
        raise CommandError(f"{database_label(url)} is not a leasehold database (never migrated): "
                           "run `leasehold migrate`, or check --database-url / LEASEHOLD_DATABASE_URL")


def announce(url: str) -> None:
    """``leasehold: database HOST:PORT/DB (user U)`` on stderr."""
    from leasehold.persistence.urls import database_label

    print(f"leasehold: database {database_label(url)}", file=sys.stderr, flush=True)
