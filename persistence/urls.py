"""Naming a database without its secrets, for logs and the command line's stderr."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

__all__ = ["database_label"]


def database_label(url: str) -> str:
    """``host:port/dbname (user NAME)`` of a ``postgresql://`` URL or conninfo string: never the
    password. A socket directory as host is shown as it is."""
    try:
        params = conninfo_to_dict(url.replace("postgresql+psycopg://", "postgresql://", 1))
    except Exception:
        return "<unparsable database URL>"
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = str(params.get("port") or 5432)
    dbname = str(params.get("dbname") or params.get("user") or "postgres")
    user = params.get("user")
    return f"{host}:{port}/{dbname}" + (f" (user {user})" if user else "")
