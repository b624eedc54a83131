"""Every named SQL statement parses and plans against the migrated schema."""

from __future__ import annotations

import re

import psycopg
import pytest

from leasehold.persistence.queries import QUERIES

PARAM = re.compile(r"%\((\w+)\)[sb]")


def test_queries_are_loaded() -> None:
    assert {"task_lock", "task_read_for_write", "task_lock_for_organization", "fair_share_candidates", "worker_lock_for_acquire"} <= set(QUERIES)


@pytest.mark.parametrize("name", sorted(QUERIES))
async def test_statement_plans(database_url: str, name: str) -> None:
    query = QUERIES[name]
    params = {p: None for p in PARAM.findall(query)}
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        # EXPLAIN binds, parses and plans the statement without running it.
        cur = await conn.execute("EXPLAIN " + query, params)  # type: ignore[arg-type]
        assert await cur.fetchall()
