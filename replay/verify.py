"""``replay verify``: rebuild in memory and compare with the live projections, row by row.

Both reads happen in one read-only ``REPEATABLE READ`` snapshot, so transactions that commit
while it runs are either entirely visible (their events and their projection changes) or not at
all: verify can run while the Gateway is under load without false alarms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from persistence.snapshot import snapshot
from persistence.tables import load_tables
from projections.compare import Difference, diff
from replay.fold import Progress, fold
from replay.gcpause import gc_paused


@dataclass(frozen=True, slots=True)
class Verified:
    events: int
    rows: dict[str, int]
    differences: list[Difference]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.differences


async def verify_projections(conn: AsyncConnection[Any], *, schema: str = "public",
                             progress: Progress | None = None) -> Verified:
    """Every difference between the projections in ``schema`` and a rebuild of the log."""
    started = time.perf_counter()
    with gc_paused():
        async with snapshot(conn):
            folded = await fold(conn, progress=progress)
            live = await load_tables(conn, schema)
        differences = diff(live, folded.tables.tables)
    rows = {table: len(r) for table, r in live.items()}
    return Verified(folded.events, rows, differences, time.perf_counter() - started)
