"""Publishing worker presence (migration 0020): one statement for every worker that changed."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from leasehold.persistence.queries import QUERIES


async def publish(conn: AsyncConnection[Any], worker_ids: Sequence[UUID],
                  ages: tuple[Sequence[float | None], Sequence[float | None], Sequence[float | None]],
                  *, now: datetime | None = None) -> int:
    """Upsert the presence of ``worker_ids`` (sorted by id), each kind seen ``ages`` seconds
    before the database's clock (or ``now``): one statement, one transaction on an autocommit
    connection. How many rows it wrote (unknown workers are skipped)."""
    poll, renew, write = ages
    cur = await conn.execute(QUERIES["worker_presence_publish"], {
        "worker_ids": list(worker_ids), "poll_ages": list(poll), "renew_ages": list(renew),
        "write_ages": list(write), "now": now})
    return cur.rowcount
