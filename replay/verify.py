"""``replay verify``: rebuild in memory and compare with the live projections, row by row.

Both reads happen in one read-only ``REPEATABLE READ`` snapshot (shared by every process of a
parallel run), so transactions that commit while it runs are either entirely visible (their
events and their projection changes) or not at all: verify can run while the Gateway is under
load without false alarms. Memory holds one chunk of stream groups at a time
(:mod:`replay.parallel`).

Incremental verification (``since``, a checkpoint): only the stream groups with an event the
checkpoint did not seal (found among the events of transactions from its ``transaction_xmin``
on, through the ``events_transaction_idx`` index, and held against the heads it sealed) are
refolded, each from its first event, and compared with their live rows; so a daily audit costs
about a day's events. Rows of groups the log has not
touched since then are not read again (the verification that covered the checkpoint did), and
a touched scan's untouched tasks are found through the projection's ``worker_tasks.scan_id``
index: a full verification, the default, reads everything.

The stored pages of tasks' scopes are not projections (the log lists their hashes, see
``domain.scopes``): every page the verified tasks refer to is held against its sha256, and one
that is missing or changed is a difference of table ``scope_pages``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from leasehold.persistence.checkpoints import Checkpoint, latest_checkpoint
from leasehold.persistence.event_log import streams_touched_since
from leasehold.persistence.scope_pages import damaged_scope_pages
from leasehold.persistence.snapshot import snapshot
from leasehold.projections.compare import Difference
from leasehold.replay.fold import Progress
from leasehold.replay.parallel import Part, over_ranges, verify_groups

#: Groups per refold of an incremental verification.
GROUPS_PER_CHUNK = 2_000


@dataclass(frozen=True, slots=True)
class Verified:
    events: int
    rows: dict[str, int]
    differences: list[Difference]
    seconds: float
    since: Checkpoint | None = None
    #: The newest checkpoint in the verified snapshot: every event it seals was verified, so it
    #: is where the next incremental verification can start.
    latest: Checkpoint | None = None

    @property
    def ok(self) -> bool:
        return not self.differences


async def verify_projections(conn: AsyncConnection[Any], *, schema: str = "public",
                             progress: Progress | None = None, jobs: int = 1, url: str | None = None,
                             since: Checkpoint | None = None) -> Verified:
    """Every difference between the projections in ``schema`` and a rebuild of the log (with
    ``since``, of the stream groups the log touched from that checkpoint on). ``jobs`` above 1
    runs that many processes, which connect to ``url``."""
    if jobs > 1 and url is None:
        raise ValueError("a parallel verification needs the database url")
    started = time.perf_counter()
    async with snapshot(conn):
        latest = await latest_checkpoint(conn)
        if since is not None:
            part, streams = await _touched(conn, schema, since, progress)
        else:
            part = await over_ranges(conn, url or "", ("verify", schema), jobs=jobs, progress=progress)
            streams = None
        damaged = await damaged_scope_pages(conn, streams) if schema == "public" else []
    differences = part.comparison.differences() + [_damaged(key, actual) for key, actual in damaged]
    return Verified(part.events, part.rows, differences, time.perf_counter() - started, since, latest)


def _damaged(key: str, actual: str | None) -> Difference:
    """A stored scope page that the log names (by ``key``, its sha256) and that is missing or
    changed (its bytes hash to ``actual``)."""
    if actual is None:
        return Difference("scope_pages", (key,), "missing_live", {})
    return Difference("scope_pages", (key,), "changed", {"sha256": (actual, key)})


async def _touched(conn: AsyncConnection[Any], schema: str, since: Checkpoint,
                   progress: Progress | None) -> tuple[Part, list[UUID]]:
    """The verification of the groups touched since ``since``, and every stream it refolded."""
    total = Part()
    touched: list[UUID] = []
    groups: list[UUID] = []
    streams: list[UUID] = []

    async def flush() -> None:
        done = total.events
        part = await verify_groups(conn, schema, groups, streams,
                                   progress=None if progress is None else (lambda n: progress(done + n)))
        total.merge(part)
        groups.clear()
        streams.clear()

    async for batch in streams_touched_since(conn, since.id, since.transaction_xmin):
        touched.extend(stream for stream, _ in batch)
        for stream, group in batch:
            if not groups or groups[-1] != group:
                if len(groups) >= GROUPS_PER_CHUNK:
                    await flush()
                groups.append(group)
            streams.append(stream)
    if groups:
        await flush()
    return total, touched
