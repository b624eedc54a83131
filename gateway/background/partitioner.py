"""Event log partitions ahead of time: a background loop that keeps the log's time partitions
reaching ``partition_ahead`` past now (:func:`persistence.partitions.ensure_partitions`).

Several Gateway processes may run it: the database function serialises them (an advisory
lock), so a partition is created once. An append never depends on this loop: a row no
partition covers goes to the default partition.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from leasehold.gateway.background.loops import every
from leasehold.persistence.partitions import ensure_partitions
from leasehold.persistence.transaction import Database

log = logging.getLogger("leasehold.gateway")


async def run(db: Database, interval: float, *, span: str, ahead: str,
              on_pass: Callable[[int], None] | None = None) -> None:
    """Ensure the partitions now, then every ``interval`` seconds, forever."""

    async def step() -> int:
        async with db.connection() as conn:
            created = await ensure_partitions(conn, span=span, ahead=ahead)
        if created:
            log.info("event log partitions created", extra={"partitions": created})
        return len(created)

    await every(interval, step, name="partitions", on_pass=on_pass)
