"""The event log's time partitions: creating them ahead, reading one, and letting an archived one go.

``events`` is range-partitioned on ``recorded_at`` (migration 0018). ``events_ensure_partitions``
(a SECURITY DEFINER function, so the application role may call it) creates partitions ahead of
time; a default partition takes any row no partition covers, so an append never fails for lack
of one. A partition leaves the log only through :func:`drop_archived`: the owner detaches and
drops it in the transaction that records its archive in ``event_archives``, after checking
that the partition still holds exactly the events the archive holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, sql

from leasehold.persistence.event_log import StoredRow, stored_row
from leasehold.persistence.rows import execute_named, named_rows

#: How long retention waits for the locks that detach a partition before giving up.
LOCK_TIMEOUT_MS = 5_000


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    lower_bound: datetime | None  # None: from the beginning (or the default partition)
    upper_bound: datetime | None  # None: the default partition
    is_default: bool
    estimated_rows: int


@dataclass(frozen=True, slots=True)
class PartitionContents:
    events: int
    streams: int
    first_notification_id: int | None
    last_notification_id: int | None


@dataclass(frozen=True, slots=True)
class ArchiveRecord:
    id: int
    partition_name: str
    lower_bound: datetime | None
    upper_bound: datetime
    events: int
    streams: int
    first_notification_id: int | None
    last_notification_id: int | None
    manifest_sha256: str
    key_id: str
    archived_at: datetime


async def ensure_partitions(conn: AsyncConnection[Any], *, span: str = "1 month", ahead: str = "2 months"
                            ) -> list[str]:
    """Create partitions of ``span`` until the log is covered up to now() + ``ahead`` (PostgreSQL
    intervals); the names of those created (none when coverage already reaches that far)."""
    async with conn.transaction():
        cur = await execute_named(conn, "SELECT events_ensure_partitions(%s::interval, %s::interval) AS name",
                                  (span, ahead))
        return [str(r.name) for r in await cur.fetchall()]


async def list_partitions(conn: AsyncConnection[Any]) -> list[Partition]:
    """Every partition of the log, oldest first (the default partition last)."""
    cur = await execute_named(
        conn, "SELECT p.name, p.lower_bound, p.upper_bound, p.is_default,"
              " greatest(c.reltuples, 0)::bigint AS estimated_rows"
              " FROM event_partitions p JOIN pg_class c ON c.relname = p.name"
              " AND c.relnamespace = 'public'::regnamespace"
              " ORDER BY p.is_default, p.upper_bound NULLS LAST")
    return [Partition(**r._asdict()) for r in await cur.fetchall()]


async def partition_contents(conn: AsyncConnection[Any], name: str) -> PartitionContents:
    """Exact counts of one partition (a full read of it)."""
    cur = await execute_named(conn, sql.SQL(
        "SELECT count(*) AS events, count(DISTINCT originator_id) AS streams,"
        " min(notification_id) AS first_notification_id, max(notification_id) AS last_notification_id FROM {}"
    ).format(sql.Identifier(name)))
    row = await cur.fetchone()
    assert row is not None, "an aggregate always returns a row"
    return PartitionContents(int(row.events), int(row.streams), row.first_notification_id, row.last_notification_id)


async def partition_rows(conn: AsyncConnection[Any], name: str, *, batch_size: int = 10_000
                         ) -> AsyncIterator[list[StoredRow]]:
    """Every event of one partition in ``notification_id`` order, in batches, through a
    server-side cursor (needs a transaction; other statements may run between batches)."""
    query = sql.SQL(
        "SELECT notification_id, originator_id, originator_version, topic, state, recorded_at,"
        " transaction_id::text, prev_hash, hash FROM {} ORDER BY notification_id").format(sql.Identifier(name))
    async with conn.cursor(name="partition_rows", row_factory=named_rows) as cur:
        await cur.execute(query)
        while rows := await cur.fetchmany(batch_size):
            yield [stored_row(r) for r in rows]


class PartitionChanged(RuntimeError):
    """The partition no longer holds what was archived: nothing was dropped."""


async def drop_archived(conn: AsyncConnection[Any], partition: Partition, archived: PartitionContents,
                        manifest_sha256: str, key_id: str) -> ArchiveRecord:
    """Detach and drop ``partition`` and record its archive, in one transaction, if it still
    holds exactly what was archived (its count and notification id range, read under the
    detach's lock); otherwise raise :class:`PartitionChanged` and change nothing."""
    if partition.is_default or partition.upper_bound is None:
        raise ValueError("the default partition is never archived")
    ident = sql.Identifier(partition.name)
    async with conn.transaction():
        # DETACH locks the whole log: appends wait behind it, and it waits for every reader of
        # the log. Better to give up (and run again later) than to stall the Gateway.
        await conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{LOCK_TIMEOUT_MS}ms")))
        await conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(ident))
        now = await partition_contents(conn, partition.name)
        if now != archived:
            raise PartitionChanged(f"{partition.name} holds {now}, the archive holds {archived}")
        await conn.execute(sql.SQL("ALTER TABLE events DETACH PARTITION {}").format(ident))
        cur = await execute_named(
            conn, "INSERT INTO event_archives (partition_name, lower_bound, upper_bound, events, streams,"
            " first_notification_id, last_notification_id, manifest_sha256, key_id)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " RETURNING id, partition_name, lower_bound, upper_bound, events, streams, first_notification_id,"
            " last_notification_id, manifest_sha256, key_id, archived_at",
            (partition.name, partition.lower_bound, partition.upper_bound, archived.events, archived.streams,
             archived.first_notification_id, archived.last_notification_id, manifest_sha256, key_id))
        row = await cur.fetchone()
        assert row is not None
        await conn.execute(sql.SQL("DROP TABLE {}").format(ident))
    return ArchiveRecord(**row._asdict())


async def archive_records(conn: AsyncConnection[Any]) -> list[ArchiveRecord]:
    """The register of archived partitions, oldest range first."""
    cur = await execute_named(
        conn, "SELECT id, partition_name, lower_bound, upper_bound, events, streams, first_notification_id,"
              " last_notification_id, manifest_sha256, key_id, archived_at FROM event_archives ORDER BY upper_bound, id")
    return [ArchiveRecord(**r._asdict()) for r in await cur.fetchall()]


async def database_now(conn: AsyncConnection[Any]) -> datetime:
    cur = await execute_named(conn, "SELECT now() AS now")
    row = await cur.fetchone()
    assert row is not None
    return row.now
