"""Schema migrations through Alembic's Python API (no ``alembic.ini`` needed).

The revision scripts live in the installed ``migrations`` package (``migrations/versions/``);
they use raw SQL via ``op.execute``. URLs are plain ``postgresql://`` URLs; they are converted to
SQLAlchemy's ``postgresql+psycopg://`` form internally.

Concurrent ``upgrade``/``downgrade`` calls against the same database are serialised with a
session-level advisory lock (:data:`MIGRATION_LOCK_KEY`), and every revision runs in its own
transaction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from leasehold import migrations as _migrations_package

__all__ = [
    "MIGRATIONS_DIR",
    "MIGRATION_LOCK_KEY",
    "current",
    "downgrade",
    "downgrade_sql",
    "head",
    "history",
    "make_config",
    "revisions",
    "sqlalchemy_url",
    "upgrade",
    "upgrade_sql",
]

#: Directory of the installed ``migrations`` package (holds ``env.py`` and ``versions/``).
MIGRATIONS_DIR = Path(_migrations_package.__path__[0]).resolve()
#: ``pg_advisory_lock`` key taken by ``migrations/env.py`` while migrating (fits in a bigint).
MIGRATION_LOCK_KEY = 0x1EA5E401D_0001


def sqlalchemy_url(url: str) -> str:
    """Convert a ``postgresql://`` / ``postgres://`` URL to SQLAlchemy's ``postgresql+psycopg://``.

    URLs that already name a driver (``postgresql+psycopg://``) are returned unchanged. A
    multi-host URL (``postgresql://u@h1:5432,h2:5432/db?target_session_attrs=read-write``, a
    high-availability cluster) has its hosts moved to ``host=`` query parameters, the form
    SQLAlchemy parses; libpq still gets every host and picks the writable one.
    """
    parts = urlsplit(url)
    if parts.scheme in ("postgresql", "postgres"):
        userinfo, _, hosts = parts.netloc.rpartition("@")
        if "," in hosts:
            query = "&".join([*(f"host={h}" for h in hosts.split(",")), *([parts.query] if parts.query else [])])
            netloc = f"{userinfo}@" if userinfo else ""
            return urlunsplit(parts._replace(scheme="postgresql+psycopg", netloc=netloc, query=query))
        return urlunsplit(parts._replace(scheme="postgresql+psycopg"))
    if parts.scheme.startswith("postgresql+"):
        return url
    raise ValueError(f"unsupported database URL scheme {parts.scheme!r} (expected postgresql://)")


def make_config(url: str | None = None) -> Config:
    """Return a programmatic Alembic :class:`Config` for the ``migrations`` package.

    ``url`` (a plain ``postgresql://`` URL) is handed to ``env.py`` through ``config.attributes``.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    if url is not None:
        config.attributes["url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> str | None:
    """Upgrade the database at ``url`` to ``revision``; return the revision it is at afterwards."""
    command.upgrade(make_config(url), revision)
    return current(url)


def downgrade(url: str, revision: str) -> str | None:
    """Downgrade the database at ``url`` to ``revision`` (``"-1"``, ``"base"``, an id...).

    Returns the revision it is at afterwards (``None`` at base).
    """
    command.downgrade(make_config(url), revision)
    return current(url)


def upgrade_sql(revision: str = "head", *, start: str | None = None, output: Any = None) -> None:
    """Write the SQL of upgrading from ``start`` (default: base) to ``revision`` to ``output``
    (default: stdout), without a database (Alembic's offline mode)."""
    config = make_config()
    if output is not None:
        config.output_buffer = output
    command.upgrade(config, f"{start}:{revision}" if start else revision, sql=True)


def downgrade_sql(start: str, revision: str, *, output: Any = None) -> None:
    """Write the SQL of downgrading from ``start`` to ``revision`` to ``output`` (offline)."""
    config = make_config()
    if output is not None:
        config.output_buffer = output
    command.downgrade(config, f"{start}:{revision}", sql=True)


def history() -> list[tuple[str, str | None, str]]:
    """``(revision, down_revision, first line of its docstring)`` of every revision, base first."""
    script = ScriptDirectory.from_config(make_config())
    found = []
    for rev in reversed(list(script.walk_revisions())):
        doc = (rev.doc or "").strip().splitlines()
        down = rev.down_revision if isinstance(rev.down_revision, str | None) else ",".join(rev.down_revision)
        found.append((rev.revision, down, doc[0] if doc else ""))
    return found


def revisions() -> list[str]:
    """Return every revision id, ordered from base to head."""
    script = ScriptDirectory.from_config(make_config())
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


def head() -> str | None:
    """Return the head revision id (``None`` when there are no revisions)."""
    return ScriptDirectory.from_config(make_config()).get_current_head()


def current(url: str) -> str | None:
    """Return the revision the database at ``url`` is at (``None`` at base / never migrated)."""
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
