"""``replay verify-chain --digests``: hold the log against the signed seals an auditor kept.

The digest records (:mod:`persistence.seals`) are checked on their own first, with no trust in
the database: each signature under the given public key, each seal recomputed from its changed
heads, each record chained to the one before (from the first checkpoint on), counts that add up.
Their fold is the head of every stream as of the newest digest. Then the log:

* every sealed head must still be in the log with the sealed hash: otherwise the stream was
  deleted, its tail cut, or it was rewritten (an edit, removal or reordering that someone hid by
  recomputing the hashes after it); the hash chain walk (:mod:`replay.integrity`) catches the
  rest up to that head;
* an event no digest covers (a version above its stream's sealed head, or a stream never
  sealed) is either **unsealed** — written by a transaction the newest digest could not see
  yet, the window that the next seal closes — or **added**: its transaction was already over
  when the newest digest was taken (``transaction_id`` below its ``transaction_xmin``), so a
  seal would have covered it had it been there;
* every checkpoint the digests record must still be in the database with the same seal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from psycopg import AsyncConnection

from leasehold.persistence.checkpoints import GENESIS_SEAL, ArchivedHashes, Checkpoint, seal_of
from leasehold.persistence.seals import FORMAT, DigestSink, heads_of, open_sink, signature_problem
from leasehold.persistence.transaction import Reader


@dataclass(frozen=True, slots=True)
class DigestProblem:
    message: str
    originator_id: UUID | None = None
    version: int | None = None
    checkpoint_id: int | None = None


@dataclass(slots=True)
class Digests:
    """The verified fold of a digest sink."""

    records: int = 0
    heads: dict[UUID, tuple[int, bytes]] = field(default_factory=dict)
    newest: dict[str, Any] | None = None
    seals: dict[int, str] = field(default_factory=dict)
    problems: list[DigestProblem] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Unsealed:
    """What no digest covers yet, at verification time."""

    events: int
    streams: int
    new_streams: int
    oldest_recorded_at: datetime | None
    seconds_since_newest_digest: float | None

    def as_json(self) -> dict[str, Any]:
        return {"events": self.events, "streams": self.streams, "new_streams": self.new_streams,
                "oldest_recorded_at": self.oldest_recorded_at.isoformat() if self.oldest_recorded_at else None,
                "seconds_since_newest_digest": None if self.seconds_since_newest_digest is None
                else round(self.seconds_since_newest_digest, 3)}


def load_digests(location: str | Path | DigestSink, public_key: Ed25519PublicKey) -> Digests:
    """Check and fold every record of the sink (or directory) at ``location``."""
    sink = open_sink(location) if isinstance(location, str | Path) else location
    out = Digests()
    by_id: dict[int, tuple[str, dict[str, Any]]] = {}
    for where, record in sink.records():
        if record.get("format") != FORMAT:
            out.problems.append(DigestProblem(f"digest {where}: not a {FORMAT} record"))
            continue
        problem = signature_problem(record, public_key)
        if problem is not None:
            out.problems.append(DigestProblem(f"digest {where}: {problem}", checkpoint_id=record.get("checkpoint_id")))
            continue
        cid = int(record["checkpoint_id"])
        seen = by_id.get(cid)
        if seen is not None:
            if seen[1] != record:
                out.problems.append(DigestProblem(
                    f"digest {where}: a second, different record of checkpoint {cid} (first at {seen[0]})",
                    checkpoint_id=cid))
            continue
        by_id[cid] = (where, record)
    prev_seal = GENESIS_SEAL.hex()
    event_count = 0
    for cid in sorted(by_id):
        where, record = by_id[cid]
        out.records += 1
        if record["prev_seal"] != prev_seal:
            out.problems.append(DigestProblem(
                f"digest {where}: checkpoint {cid} does not chain to the digest before it (a checkpoint was"
                " removed or rewritten in the database, or a digest is missing)", checkpoint_id=cid))
        heads = heads_of(record)
        for head in heads:
            before = out.heads.get(head.originator_id)
            if before is not None and before[0] >= head.version:
                out.problems.append(DigestProblem(f"digest {where}: goes back from v{before[0]}",
                                                  head.originator_id, head.version, cid))
                continue
            event_count += head.version - (before[0] if before else 0)
            out.heads[head.originator_id] = (head.version, head.hash)
        created_at = datetime.fromisoformat(record["created_at"])
        if seal_of(bytes.fromhex(record["prev_seal"]), created_at, record["head_count"], record["event_count"],
                   heads).hex() != record["seal"]:
            out.problems.append(DigestProblem(f"digest {where}: the seal does not match its heads", checkpoint_id=cid))
        if (len(out.heads), event_count) != (record["head_count"], record["event_count"]):
            out.problems.append(DigestProblem(
                f"digest {where}: counts {record['head_count']} streams/{record['event_count']} events, its heads"
                f" give {len(out.heads)}/{event_count}", checkpoint_id=cid))
        prev_seal = record["seal"]
        out.seals[cid] = record["seal"]
        out.newest = record
    return out


async def log_against_digests(conn: AsyncConnection[Any], digests: Digests, checkpoints: list[Checkpoint],
                              archived: ArchivedHashes | None = None) -> tuple[list[DigestProblem], Unsealed]:
    """Compare the log (and the database's checkpoints) with the folded digests, in the caller's
    snapshot; the problems, and the unsealed window. A sealed head no longer in the log is looked
    up in ``archived`` (the archives' hashes by (stream, version)) when given."""
    problems: list[DigestProblem] = []
    oids = list(digests.heads)
    versions = [digests.heads[o][0] for o in oids]
    reader = Reader(conn)
    mismatches = await reader.all("events_against_sealed_heads", {
        "oids": oids, "versions": versions, "hashes": [digests.heads[o][1] for o in oids]})
    in_archives = archived({(r[0], r[1]) for r in mismatches if not r[2]}) if archived is not None else {}
    for oid, version, present, live_head in mismatches:
        if not present and in_archives.get((oid, version)) == digests.heads[oid][1]:
            continue  # archived, as sealed
        if live_head is None:
            message = "stream deleted: a digest sealed it, but the log has no event of it"
        elif not present:
            message = f"tail removed: a digest sealed v{version}, but the log ends at v{live_head}"
        else:
            message = "hash differs from the one a digest sealed (events up to here were altered, removed or" \
                      " reordered, and the hashes recomputed)"
        problems.append(DigestProblem(message, oid, version))
    newest = digests.newest
    xmin = str(newest["transaction_xmin"]) if newest else "0"
    events = 0
    streams: set[UUID] = set()
    new_streams: set[UUID] = set()
    flagged: set[UUID] = set()
    oldest: datetime | None = None
    for oid, version, recorded_at, unsealed_stream, before_newest in await reader.all(
            "events_not_sealed", {"oids": oids, "versions": versions, "xmin": xmin}):
        if before_newest and newest is not None:
            if oid not in flagged:
                flagged.add(oid)
                what = "a stream no digest sealed" if unsealed_stream else "beyond the head a digest sealed"
                problems.append(DigestProblem(
                    f"event added: {what}, yet written before the newest digest (checkpoint"
                    f" {newest['checkpoint_id']}) was taken", oid, version))
            continue
        events += 1
        streams.add(oid)
        if unsealed_stream:
            new_streams.add(oid)
        oldest = recorded_at if oldest is None or recorded_at < oldest else oldest
    in_db = {c.id: c.seal.hex() for c in checkpoints}
    for cid, seal in digests.seals.items():
        if cid not in in_db:
            problems.append(DigestProblem(f"checkpoint {cid} of the digests is missing from the database (deleted)",
                                          checkpoint_id=cid))
        elif in_db[cid] != seal:
            problems.append(DigestProblem(f"checkpoint {cid} in the database differs from its digest (rewritten)",
                                          checkpoint_id=cid))
    row = await reader.one("snapshot_time", {})
    now = row[0] if row else None
    since = None
    if newest is not None and now is not None:
        since = max(0.0, (now - datetime.fromisoformat(newest["created_at"])).total_seconds())
    return problems, Unsealed(events, len(streams), len(new_streams), oldest, since)
