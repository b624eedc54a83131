"""The stored pages of tasks' scopes, held against their hashes for ``replay verify``.

A task's ``TaskCreated`` lists the sha256 of each stored page of its scope (``domain.scopes``), and
``replay verify`` checks ``worker_tasks.scope_pages`` against the log like every projection. What
it cannot fold from the log is the pages themselves: this finds those that are missing, or whose
bytes no longer hash to their key, with the hashes computed by the database (no page travels).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from leasehold.persistence.queries import QUERIES
from leasehold.persistence.rows import execute_named


async def damaged_scope_pages(conn: AsyncConnection[Any],
                              task_ids: Sequence[UUID] | None = None) -> list[tuple[str, str | None]]:
    """(key, the sha256 its bytes have now, None when it is missing) of every damaged page the
    tasks ``task_ids`` (None: every task) refer to, in key order; inside the caller's snapshot."""
    cur = await execute_named(conn, QUERIES["scope_pages_damaged"],
                              {"task_ids": None if task_ids is None else list(task_ids)})
    return [(r.sha256, r.computed) for r in await cur.fetchall()]
