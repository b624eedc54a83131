"""Connections and pools configured the same way everywhere (gateway, replay, tests, bench)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from psycopg import AsyncConnection
from psycopg.pq import Format
from psycopg.types.json import JsonbDumper, set_json_dumps, set_json_loads
from psycopg_pool import AsyncConnectionPool

from leasehold.persistence.rows import named_rows


def load_json(data: str | bytes) -> Any:
    """A stored JSON value. orjson reads every value the input limits admit; a number past a
    double's range (jsonb keeps any, and values stored before the limits may hold one) makes it
    give up, so such a value loads with the standard library instead (as a Python int or an
    infinite float): a read never fails on it, and an answer shows it clipped."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


# One JSON path for the database too: orjson both ways.
set_json_dumps(lambda obj: orjson.dumps(obj).decode())
set_json_loads(load_json)


#: The schema's domains (migration 0008): each one's type and array type, and its base type's.
_DOMAINS = """
SELECT d.oid AS domain, d.typarray AS domain_array, b.oid AS base, b.typarray AS base_array
FROM pg_type d JOIN pg_type b ON b.oid = d.typbasetype
WHERE d.typtype = 'd' AND d.typnamespace = 'public'::regnamespace
"""


async def configure(conn: AsyncConnection[Any]) -> None:
    """Per-connection setup: Python dicts travel as jsonb; values of the schema's domains load as
    their base types; autocommit, so that commands send their own BEGIN/COMMIT inside one
    pipeline (see ``persistence.transaction``)."""
    conn.adapters.register_dumper(dict, JsonbDumper)
    await conn.set_autocommit(True)
    await _load_domains_as_their_base_types(conn)


async def _load_domains_as_their_base_types(conn: AsyncConnection[Any]) -> None:
    """A domain column comes back with its base type's OID, but an array of a domain (an
    ``array_agg`` of ``worker_tasks.state``, say) with the domain's own array OID, which psycopg
    would hand over as unparsed text. Load both with the base type's loaders."""
    cur = await conn.cursor(row_factory=named_rows).execute(_DOMAINS)
    for d in await cur.fetchall():
        for fmt in (Format.TEXT, Format.BINARY):
            for oid, like in ((d.domain, d.base), (d.domain_array, d.base_array)):
                loader = conn.adapters.get_loader(like, fmt)
                if loader is not None:
                    conn.adapters.register_loader(oid, loader)


async def connect(url: str, **kwargs: Any) -> AsyncConnection[Any]:
    """One configured connection (for tools and tests)."""
    conn = await AsyncConnection.connect(url, **kwargs)
    await configure(conn)
    return conn


def create_pool(url: str, *, min_size: int = 2, max_size: int = 20, prepare: bool = True,
                **kwargs: Any) -> AsyncConnectionPool:
    """A connection pool whose connections are configured; open it with ``await pool.open()``.

    ``prepare=False``: psycopg never prepares a statement on the server (``prepare_threshold=None``).
    A transaction-pooling proxy hands each transaction to any server connection, where a statement
    prepared by an earlier transaction may be missing, or already exist under the same name."""
    if not prepare:
        kwargs["kwargs"] = {**kwargs.get("kwargs", {}), "prepare_threshold": None}
    return AsyncConnectionPool(url, min_size=min_size, max_size=max_size, configure=configure,
                               open=False, **kwargs)
