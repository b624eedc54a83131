"""Retention: archive the log's old partitions as signed archives, then let them go.

For each partition wholly older than the retention (its upper bound at or before now() minus
it), :func:`archive_partition` exports the partition in one snapshot (:mod:`replay.archive`),
verifies the written archive from disk (signature, files, chains, events, batches) and holds
it against the partition's exact counts; only then does it detach and drop the partition, in
the transaction that records the archive's manifest digest in ``event_archives``
(:func:`persistence.partitions.drop_archived`, which checks the counts again under its lock).
Any failure before that leaves the partition in place. The default partition is never
archived.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from psycopg import AsyncConnection, errors

from leasehold.persistence.partitions import (
    LOCK_TIMEOUT_MS,
    ArchiveRecord,
    Partition,
    PartitionChanged,
    database_now,
    drop_archived,
    list_partitions,
    partition_contents,
)
from leasehold.persistence.snapshot import snapshot
from leasehold.replay.archive import export_archive, verify_archive


class ArchiveFailed(RuntimeError):
    """The archive did not verify: the partition was left in place."""


@dataclass(frozen=True, slots=True)
class Archived:
    partition: Partition
    directory: Path
    record: ArchiveRecord
    seconds: float
    #: Of those: the export, the verification from disk, the detach and drop.
    export_seconds: float = 0.0
    verify_seconds: float = 0.0
    drop_seconds: float = 0.0


async def due_partitions(conn: AsyncConnection[Any], older_than: timedelta) -> list[Partition]:
    """The partitions whose whole range is older than ``older_than`` (oldest first)."""
    cutoff = await database_now(conn) - older_than
    return [p for p in await list_partitions(conn)
            if not p.is_default and p.upper_bound is not None and p.upper_bound <= cutoff]


async def archive_partition(conn: AsyncConnection[Any], partition: Partition, out: Path,
                            signing_key: Ed25519PrivateKey) -> Archived:
    """Export ``partition`` to ``out``, verify the archive, then detach and drop the partition
    and record the archive; :class:`ArchiveFailed` (partition kept) if the archive does not
    verify or does not hold exactly the partition's events."""
    started = time.perf_counter()
    async with snapshot(conn):
        expected = await partition_contents(conn, partition.name)
        written = await export_archive(conn, partition, out, signing_key)
    exported = time.perf_counter()
    check = verify_archive(out, public_key=signing_key.public_key())
    verified = time.perf_counter()
    if check.problems:
        raise ArchiveFailed(f"{partition.name}: the archive in {out} does not verify, nothing dropped: "
                            + "; ".join(check.problems[:5]))
    if (written.contents != expected or check.events != expected.events
            or check.manifest_sha256 != written.manifest_sha256):
        raise ArchiveFailed(f"{partition.name}: the archive holds {check.events} events, the partition"
                            f" {expected.events}: nothing dropped")
    try:
        record = await drop_archived(conn, partition, expected, written.manifest_sha256, written.key_id)
    except errors.LockNotAvailable as exc:
        raise ArchiveFailed(f"{partition.name}: could not lock the log within {LOCK_TIMEOUT_MS / 1000:g} s"
                            f" (a long read of it?): nothing dropped; remove {out} and run again") from exc
    except PartitionChanged as exc:
        raise ArchiveFailed(f"{exc}: nothing dropped") from exc
    done = time.perf_counter()
    return Archived(partition, out, record, done - started, exported - started, verified - exported, done - verified)
