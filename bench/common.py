"""What every benchmark here shares: which server to use, and scratch databases on it."""

from __future__ import annotations

import os

import psycopg
from psycopg import sql

from projections.database import EmbeddedPostgres, with_database

MACHINE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def resolve_server_url(explicit: str | None) -> tuple[str, str]:
    """The maintenance-database URL of the server to use, and where it came from: ``--database-url``,
    else ``$BENCH_DATABASE_URL``, else the machine's server on 127.0.0.1:5432, else the embedded one."""
    if explicit:
        return explicit, "--database-url"
    env = os.environ.get("BENCH_DATABASE_URL")
    if env:
        return env, "BENCH_DATABASE_URL"
    try:
        psycopg.connect(MACHINE_URL, connect_timeout=3).close()
        return MACHINE_URL, "machine server on 127.0.0.1:5432"
    except psycopg.Error:
        pass
    server = EmbeddedPostgres(stop_at_exit=True)
    server.start()
    return server.url(), f"embedded server ({server.data_dir})"


def recreate_database(server_url: str, name: str) -> str:
    """Drop (forcefully) and create the scratch database ``name``; its URL."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_database(server_url, name)
