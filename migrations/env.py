"""Alembic environment for leasehold: online, and offline (``--sql``: the SQL printed, not run).

The database URL is taken, in order, from: ``config.attributes["url"]`` (set by
:func:`migrations.runner.make_config`), ``alembic -x url=...``, ``sqlalchemy.url`` in the ini
file, then ``$DATABASE_URL``. (``leasehold migrate`` always passes the first.)
"""

from __future__ import annotations

import contextlib
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool, text

from leasehold.migrations.runner import MIGRATION_LOCK_KEY, sqlalchemy_url

config = context.config

if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _database_url() -> str:
    url = config.attributes.get("url")
    if not url:
        url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        url = config.get_main_option("sqlalchemy.url")
    if not url:
        url = os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("no database URL: pass -x url=postgresql://… or set DATABASE_URL")
    return str(url)


def run_migrations_online() -> None:
    """Run migrations on a live connection, one transaction per revision, under an advisory lock."""
    url = sqlalchemy_url(_database_url())
    connect_args = {} if "connect_timeout" in url else {"connect_timeout": 10}
    engine = create_engine(url, poolclass=pool.NullPool, connect_args=connect_args)
    try:
        with engine.connect() as connection:
            # Session-level lock, committed immediately so alembic sees no external transaction.
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            connection.commit()
            try:
                context.configure(
                    connection=connection,
                    target_metadata=None,
                    transaction_per_migration=True,
                )
                with context.begin_transaction():
                    context.run_migrations()
            finally:
                # If this fails the connection is broken, and closing it releases the lock anyway.
                with contextlib.suppress(Exception):
                    connection.rollback()
                    connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
                    connection.commit()
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    """Print the SQL of the migrations instead of running it (``leasehold migrate --sql``): one
    transaction per revision, as online; no database is contacted."""
    context.configure(url="postgresql+psycopg://", literal_binds=True, dialect_opts={"paramstyle": "named"},
                      transaction_per_migration=True, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
