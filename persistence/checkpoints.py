"""Checkpoints: append-only seals over the heads of every stream of the event log.

The hash chain of a stream proves its events are the ones written, but only up to its current
end: deleting a whole stream, or the tail of one, leaves a shorter chain that still verifies.
A checkpoint records, for every stream, its last version and that event's chain hash; a later
``replay verify-chain`` requires every recorded head to still be in the log with the same hash.

Each checkpoint stores only the heads that changed since the previous one (the full head set at
checkpoint k is the fold of the changes of checkpoints 1..k), and its seal chains to the
previous seal::

    seal_k = sha256(b"leasehold checkpoint v1\\0" || seal_{k-1} || created_at (µs since epoch, i64)
                    || head_count (u64) || event_count (u64)
                    || for each changed head, sorted by originator_id:
                           originator_id (16 bytes) || version (u64) || hash (32 bytes))

with ``seal_0`` = 32 zero bytes, ``head_count`` the number of streams and ``event_count`` the sum
of their versions (the number of events sealed). So the seal of the latest checkpoint commits
to every head ever sealed, and writing one costs what changed, not the size of the log.
Copying the seals off the box (``replay checkpoint`` prints them) is what makes them evidence
against someone who can rewrite the database.

Which events a checkpoint reads: those of transactions from the previous checkpoint's
``transaction_xmin`` on (``events.transaction_id``, indexed), where ``transaction_xmin`` is the
oldest transaction still running when the snapshot was taken: every event of an older
transaction was visible to that checkpoint, so nothing committed late can be skipped.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection, errors, sql

from leasehold.persistence.queries import QUERIES
from leasehold.persistence.rows import execute_named, named_rows

logger = logging.getLogger(__name__)

PREFIX = b"leasehold checkpoint v1\x00"
GENESIS_SEAL = bytes(32)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Head:
    """Where one stream ended when a checkpoint was taken."""

    originator_id: UUID
    version: int
    hash: bytes


@dataclass(frozen=True, slots=True)
class Checkpoint:
    id: int
    created_at: datetime
    transaction_xmin: int
    head_count: int
    changed_count: int
    event_count: int
    prev_seal: bytes
    seal: bytes
    #: The highest ``notification_id`` in the snapshot that wrote it (known only to the writer).
    position: int | None = None


def seal_of(prev_seal: bytes, created_at: datetime, head_count: int, event_count: int,
            changed: Iterable[Head]) -> bytes:
    """The seal of a checkpoint (see the module docstring)."""
    micros = (created_at - _EPOCH) // _MICROSECOND
    h = hashlib.sha256(PREFIX)
    h.update(prev_seal)
    h.update(micros.to_bytes(8, "big", signed=True))
    h.update(head_count.to_bytes(8, "big"))
    h.update(event_count.to_bytes(8, "big"))
    for head in sorted(changed, key=lambda x: x.originator_id.bytes):
        h.update(head.originator_id.bytes)
        h.update(head.version.to_bytes(8, "big"))
        h.update(head.hash)
    return h.digest()


CHECKPOINT_COLUMNS = sql.SQL(", ").join([
    sql.Identifier("id"), sql.Identifier("created_at"), sql.SQL("{}::text").format(sql.Identifier("transaction_xmin")),
    *map(sql.Identifier, ("head_count", "changed_count", "event_count", "prev_seal", "seal"))])
_LATEST = sql.SQL("SELECT {} FROM checkpoints ORDER BY id DESC LIMIT 1").format(CHECKPOINT_COLUMNS)
_ALL = sql.SQL("SELECT {} FROM checkpoints ORDER BY id").format(CHECKPOINT_COLUMNS)


def checkpoint_from_row(r: Any) -> Checkpoint:
    """A ``checkpoints`` row as :data:`CHECKPOINT_COLUMNS` selects it, read by name."""
    return Checkpoint(id=r.id, created_at=r.created_at, transaction_xmin=int(r.transaction_xmin),
                      head_count=r.head_count, changed_count=r.changed_count, event_count=r.event_count,
                      prev_seal=bytes(r.prev_seal), seal=bytes(r.seal))


def head_from_row(r: Any) -> Head:
    """A stream's head from a row of ``originator_id, originator_version, hash``."""
    return Head(r.originator_id, r.originator_version, bytes(r.hash))


async def latest_checkpoint(conn: AsyncConnection[Any]) -> Checkpoint | None:
    cur = await execute_named(conn, _LATEST)
    row = await cur.fetchone()
    return None if row is None else checkpoint_from_row(row)


async def find_checkpoint(conn: AsyncConnection[Any], *, id: int | None = None, seal: bytes | None = None,
                          at_or_before: datetime | None = None) -> Checkpoint | None:
    """The checkpoint with that id, or that seal, or the latest one made at or before a time."""
    if id is not None:
        query = sql.SQL("SELECT {} FROM checkpoints WHERE id = %s").format(CHECKPOINT_COLUMNS)
        params: tuple[Any, ...] = (id,)
    elif seal is not None:
        query = sql.SQL("SELECT {} FROM checkpoints WHERE seal = %s").format(CHECKPOINT_COLUMNS)
        params = (seal,)
    else:
        query = sql.SQL("SELECT {} FROM checkpoints WHERE created_at <= %s ORDER BY id DESC LIMIT 1").format(
            CHECKPOINT_COLUMNS)
        params = (at_or_before,)
    cur = await execute_named(conn, query, params)
    row = await cur.fetchone()
    return None if row is None else checkpoint_from_row(row)


async def write_checkpoint(conn: AsyncConnection[Any]) -> Checkpoint:
    """Seal the current head of every stream; commits its own transaction on ``conn``.

    ``conn`` must be idle (not inside a transaction), e.g. ``async with pool.connection() as
    conn: await write_checkpoint(conn)``; the application role ``leasehold_app`` may call it.
    It reads only the events written since the previous checkpoint, so its cost follows the
    traffic, not the size of the log. Safe to call from several processes at once: the unique
    ``prev_seal`` lets one of two racing checkpoints win and the other retries on top of it.
    """
    for attempt in range(5):
        try:
            return await _write(conn)
        except errors.UniqueViolation:
            if attempt == 4:
                raise
            logger.info("a concurrent checkpoint won; retrying on top of it")
    raise AssertionError("unreachable")


_CANDIDATES = """
SELECT DISTINCT ON (originator_id) originator_id, originator_version, hash
FROM events WHERE transaction_id >= %s::xid8
ORDER BY originator_id, originator_version DESC
"""


async def sealed_heads(conn: AsyncConnection[Any], originator_ids: list[UUID]) -> dict[UUID, tuple[Head, int]]:
    """The last sealed head of each of the streams (those ever sealed), with the id of the
    checkpoint that sealed it."""
    cur = await execute_named(conn, QUERIES["checkpoint_heads_of_streams"], {"originator_ids": originator_ids},
                              binary=True)
    return {r.originator_id: (head_from_row(r), r.checkpoint_id) for r in await cur.fetchall()}


async def _write(conn: AsyncConnection[Any]) -> Checkpoint:
    async with conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        previous = await latest_checkpoint(conn)
        cur = await execute_named(conn, "SELECT now() AS now, pg_snapshot_xmin(pg_current_snapshot())::text AS xmin,"
                                        " (SELECT max(notification_id) FROM events) AS position")
        row = await cur.fetchone()
        assert row is not None
        created_at, xmin, position = row.now, int(row.xmin), row.position
        cur = await execute_named(conn, _CANDIDATES, (str(previous.transaction_xmin if previous else 0),),
                                  binary=True)
        candidates = [head_from_row(r) for r in await cur.fetchall()]
        sealed: dict[UUID, Head] = {}
        if previous is not None and candidates:
            found = await sealed_heads(conn, [c.originator_id for c in candidates])
            sealed = {oid: head for oid, (head, _) in found.items()}
        changed: list[Head] = []
        head_count = previous.head_count if previous else 0
        event_count = previous.event_count if previous else 0
        for head in candidates:
            before = sealed.get(head.originator_id)
            if before is None:
                head_count += 1
                event_count += head.version
                changed.append(head)
            elif head.version > before.version:
                event_count += head.version - before.version
                changed.append(head)
            elif head.version == before.version and head.hash != before.hash:
                # The sealed event was rewritten (legitimate appends only add versions). Keep the
                # sealed head, which is the evidence; verify-chain reports the stream.
                logger.warning("stream %s v%d differs from its sealed head; not resealed",
                               head.originator_id, head.version)
        prev_seal = previous.seal if previous else GENESIS_SEAL
        seal = seal_of(prev_seal, created_at, head_count, event_count, changed)
        cur = await execute_named(
            conn, "INSERT INTO checkpoints (created_at, transaction_xmin, head_count, changed_count, event_count,"
            " prev_seal, seal) VALUES (%s, %s::xid8, %s, %s, %s, %s, %s) RETURNING id",
            (created_at, str(xmin), head_count, len(changed), event_count, prev_seal, seal))
        inserted = await cur.fetchone()
        assert inserted is not None
        checkpoint_id = inserted.id
        async with conn.cursor() as copy_cur, copy_cur.copy(
                "COPY checkpoint_heads (checkpoint_id, originator_id, originator_version, hash)"
                " FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "uuid", "int8", "bytea"])
            for head in changed:
                await copy.write_row((checkpoint_id, head.originator_id, head.version, head.hash))
    return Checkpoint(checkpoint_id, created_at, xmin, head_count, len(changed), event_count, prev_seal, seal,
                      position or 0)


# --- verification --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointProblem:
    """Something wrong with a checkpoint, or with the log against a checkpoint."""

    checkpoint_id: int
    problem: str
    originator_id: UUID | None = None
    version: int | None = None

    def __str__(self) -> str:
        where = f"stream {self.originator_id} v{self.version}: " if self.originator_id else ""
        return f"{where}checkpoint {self.checkpoint_id}: {self.problem}"


ArchivedHashes = Callable[[set[tuple[UUID, int]]], dict[tuple[UUID, int], bytes]]


async def verify_checkpoints(conn: AsyncConnection[Any], *, archived: ArchivedHashes | None = None
                             ) -> tuple[list[Checkpoint], list[CheckpointProblem]]:
    """Check the checkpoint chain itself (seals, counts, no regressions), then the log against
    every sealed head; the first problem per stream, and every problem of the chain. A sealed
    head no longer in the log is held against ``archived`` (the hashes of archived events,
    looked up by (stream, version)) when given.

    Runs in the caller's transaction (a :func:`persistence.snapshot.snapshot`, as ``verify_log`` does).
    """
    cur = await execute_named(conn, _ALL)
    checkpoints = [checkpoint_from_row(r) for r in await cur.fetchall()]
    problems: list[CheckpointProblem] = []
    if not checkpoints:
        return checkpoints, problems
    deltas: dict[int, list[Head]] = {c.id: [] for c in checkpoints}
    async with conn.cursor(name="replay_checkpoint_heads", binary=True, row_factory=named_rows) as heads_cur:
        await heads_cur.execute("SELECT checkpoint_id, originator_id, originator_version, hash"
                                " FROM checkpoint_heads ORDER BY checkpoint_id")
        while rows := await heads_cur.fetchmany(50_000):
            for r in rows:
                if r.checkpoint_id not in deltas:
                    problems.append(CheckpointProblem(r.checkpoint_id, "heads recorded for a checkpoint that does"
                                                      " not exist", r.originator_id, r.originator_version))
                    continue
                deltas[r.checkpoint_id].append(head_from_row(r))
    full: dict[UUID, Head] = {}
    event_count = 0
    prev_seal = GENESIS_SEAL
    for c in checkpoints:
        if c.prev_seal != prev_seal:
            problems.append(CheckpointProblem(c.id, "prev_seal is not the previous checkpoint's seal"
                                                    " (a checkpoint was deleted, inserted or reordered)"))
        for head in deltas[c.id]:
            before = full.get(head.originator_id)
            if before is not None and before.version >= head.version:
                problems.append(CheckpointProblem(
                    c.id, f"goes back from v{before.version} (a stream never shrinks)", head.originator_id,
                    head.version))
            event_count += head.version - (before.version if before else 0)
            full[head.originator_id] = head
        if (len(full), event_count, len(deltas[c.id])) != (c.head_count, c.event_count, c.changed_count):
            problems.append(CheckpointProblem(
                c.id, f"counts do not match its heads: recorded {c.head_count} streams/{c.event_count} events/"
                      f"{c.changed_count} changed, heads give {len(full)}/{event_count}/{len(deltas[c.id])}"))
        if seal_of(c.prev_seal, c.created_at, c.head_count, c.event_count, deltas[c.id]) != c.seal:
            problems.append(CheckpointProblem(c.id, "seal does not match its heads (the checkpoint was edited)"))
        prev_seal = c.seal
    problems.extend(await _log_against_heads(conn, archived))
    return checkpoints, problems


_MISMATCHES = """
SELECT h.checkpoint_id, h.originator_id, h.originator_version, e.hash IS NOT NULL AS present,
       (SELECT max(x.originator_version) FROM events x WHERE x.originator_id = h.originator_id) AS live_head,
       h.hash AS sealed
FROM checkpoint_heads h
LEFT JOIN events e ON e.originator_id = h.originator_id AND e.originator_version = h.originator_version
WHERE e.hash IS DISTINCT FROM h.hash
ORDER BY h.originator_id, h.checkpoint_id
"""


async def _log_against_heads(conn: AsyncConnection[Any], archived: ArchivedHashes | None
                             ) -> list[CheckpointProblem]:
    """Every sealed head must still be in the log (or in an archive), with the same hash: the
    first miss per stream."""
    cur = await execute_named(conn, _MISMATCHES)
    rows = await cur.fetchall()
    found: dict[tuple[UUID, int], bytes] = {}
    if archived is not None:
        found = archived({(r.originator_id, r.originator_version) for r in rows if not r.present})
    out: list[CheckpointProblem] = []
    seen: set[UUID] = set()
    for r in rows:
        cid, oid, version, present, live_head, sealed = (r.checkpoint_id, r.originator_id, r.originator_version,
                                                         r.present, r.live_head, r.sealed)
        in_archive = found.get((oid, version))
        if not present and in_archive is not None and in_archive == bytes(sealed):
            continue
        if oid in seen:
            continue
        seen.add(oid)
        if in_archive is not None:
            problem = "hash in the archive differs from the sealed one (the archive or the seal was rewritten)"
        elif live_head is None:
            problem = "stream deleted: sealed here, but the log has no event of it"
        elif not present:
            problem = f"tail truncated: sealed here, but the log ends at v{live_head}"
        else:
            problem = "hash differs from the sealed one (events up to here were rewritten)"
        out.append(CheckpointProblem(cid, problem, oid, version))
    return out
