"""Connections and pools configured the same way everywhere (gateway, replay, tests, bench)."""

from __future__ import annotations

from typing import Any

import orjson
from psycopg import AsyncConnection
from psycopg.types.json import JsonbDumper, set_json_dumps, set_json_loads
from psycopg_pool import AsyncConnectionPool

# One JSON path for the database too: orjson both ways.
set_json_dumps(lambda obj: orjson.dumps(obj).decode())
set_json_loads(orjson.loads)


async def configure(conn: AsyncConnection[Any]) -> None:
    """Per-connection setup: Python dicts travel as jsonb; autocommit, so that commands send
    their own BEGIN/COMMIT inside one pipeline (see ``persistence.transaction``)."""
    conn.adapters.register_dumper(dict, JsonbDumper)
    await conn.set_autocommit(True)


async def connect(url: str, **kwargs: Any) -> AsyncConnection[Any]:
    """One configured connection (for tools and tests)."""
    conn = await AsyncConnection.connect(url, **kwargs)
    await configure(conn)
    return conn


def create_pool(url: str, *, min_size: int = 2, max_size: int = 20, **kwargs: Any) -> AsyncConnectionPool:
    """A connection pool whose connections are configured; open it with ``await pool.open()``."""
    return AsyncConnectionPool(url, min_size=min_size, max_size=max_size, configure=configure,
                               open=False, **kwargs)
