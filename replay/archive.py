"""Sealed archives of the event log's partitions (``leasehold retention run``), and reading
them back alongside the live log (``replay verify-chain --archive``, ``replay timeline --archive``).

An archive is an audit bundle (:mod:`replay.bundle`, the same files and format) whose subject
is a partition: ``{"kind": "archive", "partition", "lower_bound", "upper_bound"}``. Its events
are the partition's, in ``notification_id`` order; its batches those their
``ResultBatchAccepted`` events accepted, with the payloads. Streams cross partitions, so the
manifest gives, for each stream, where its part in the archive starts (``first_version`` and
``first_prev_hash``) as well as where it ends (``head_version``, ``head_hash``): inside one
archive the chain is checked from that first link; across archives and the live log, each
stream's part must start where its part in the previous archive ended
(:class:`ArchiveSet`). ``manifest.sig`` signs the manifest (Ed25519), so a file changed and its
digest recomputed in the manifest is caught by the signature.

Export and verification stream the files (memory holds one batch of events and one entry per
stream), so a partition of millions of events is archived in bounded memory.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any
from uuid import UUID

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from psycopg import AsyncConnection

from leasehold.persistence.chain import check_link
from leasehold.persistence.codec import decode_event
from leasehold.persistence.event_log import StoredRow
from leasehold.persistence.partitions import Partition, PartitionContents, partition_rows
from leasehold.persistence.seals import key_id
from leasehold.persistence.transaction import Reader
from leasehold.replay.bundle import (
    FORMAT,
    SIGNATURE,
    SIGNATURE_FORMAT,
    batch_lines,
    batch_payload_problems,
    event_line,
    raw_state,
    require_empty,
    signature_problems,
    verify_bundle,
)

KIND = "archive"


@dataclass(frozen=True, slots=True)
class ArchiveWritten:
    directory: Path
    partition: str
    contents: PartitionContents
    batches: int
    manifest_sha256: str
    key_id: str


@dataclass(slots=True)
class _Stream:
    first_version: int
    first_prev_hash: str
    head_version: int
    head_hash: str
    events: int = 0


class _Lines:
    """A JSON-lines file being written, with its digest, size and line count."""

    def __init__(self, path: Path) -> None:
        self.file: IO[bytes] = path.open("wb")
        self.digest = hashlib.sha256()
        self.lines = self.bytes = 0

    def write(self, line: dict[str, Any]) -> None:
        data = orjson.dumps(line) + b"\n"
        self.file.write(data)
        self.digest.update(data)
        self.lines += 1
        self.bytes += len(data)

    def close(self) -> dict[str, Any]:
        self.file.close()
        return {"sha256": self.digest.hexdigest(), "bytes": self.bytes, "lines": self.lines}


async def export_archive(conn: AsyncConnection[Any], partition: Partition, out: Path,
                         signing_key: Ed25519PrivateKey) -> ArchiveWritten:
    """Write the archive of ``partition`` into ``out`` (new or empty), signed with ``signing_key``.

    Reads in the caller's transaction: run it inside :func:`persistence.snapshot.snapshot`.
    """
    events_file, batches_file = _open(out)
    streams: dict[UUID, _Stream] = {}
    first_nid: int | None = None
    last_nid: int | None = None
    try:
        async for rows in partition_rows(conn, partition.name):
            for row in rows:
                events_file.write(event_line(row))
                _extend(streams, row)
            for line in await batch_lines(conn, rows):
                batches_file.write(line)
            first_nid = rows[0].notification_id if first_nid is None else first_nid
            last_nid = rows[-1].notification_id
    finally:
        files = {"events.jsonl": events_file.close(), "batches.jsonl": batches_file.close()}
    now_row = await Reader(conn).one("snapshot_time", {})
    assert now_row is not None
    contents = PartitionContents(events_file.lines, len(streams), first_nid, last_nid)
    manifest = {
        "format": FORMAT,
        "created_at": now_row[0].isoformat(),
        "subject": {"kind": KIND, "partition": partition.name, "lower_bound": _iso(partition.lower_bound),
                    "upper_bound": _iso(partition.upper_bound),
                    "first_notification_id": first_nid, "last_notification_id": last_nid},
        "streams": [{"originator_id": str(oid), "type": "other", "events": s.events,
                     "first_version": s.first_version, "first_prev_hash": s.first_prev_hash,
                     "head_version": s.head_version, "head_hash": s.head_hash} for oid, s in streams.items()],
        "counts": {"streams": len(streams), "events": events_file.lines, "batches": batches_file.lines},
        "checkpoint": None,
        "files": files,
    }
    body = orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    (out / "manifest.json").write_bytes(body)
    kid = key_id(signing_key.public_key())
    (out / SIGNATURE).write_bytes(orjson.dumps({
        "format": SIGNATURE_FORMAT, "key_id": kid,
        "signature": base64.b64encode(signing_key.sign(body)).decode()}, option=orjson.OPT_INDENT_2))
    return ArchiveWritten(out, partition.name, contents, batches_file.lines, hashlib.sha256(body).hexdigest(), kid)


def _open(out: Path) -> tuple[_Lines, _Lines]:
    require_empty(out)
    out.mkdir(parents=True, exist_ok=True)
    return _Lines(out / "events.jsonl"), _Lines(out / "batches.jsonl")


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def _extend(streams: dict[UUID, _Stream], row: StoredRow) -> None:
    s = streams.get(row.originator_id)
    if s is None:
        s = streams[row.originator_id] = _Stream(row.originator_version, row.prev_hash.hex(),
                                                 row.originator_version, row.hash.hex())
    s.head_version, s.head_hash = row.originator_version, row.hash.hex()
    s.events += 1


# --- verification (offline) ------------------------------------------------------------------


@dataclass(slots=True)
class ArchiveCheck:
    """What verifying one archive found, and what the chain walk across archives needs from it."""

    directory: Path
    manifest: dict[str, Any]
    manifest_sha256: str
    problems: list[str] = field(default_factory=list)
    events: int = 0
    batches: int = 0
    #: stream -> (first version, its prev_hash, head version, head hash) of the stream's part here.
    parts: dict[UUID, tuple[int, bytes, int, bytes]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def upper_bound(self) -> str:
        return str(self.manifest.get("subject", {}).get("upper_bound") or "")

    def summary(self) -> dict[str, Any]:
        return {"subject": self.manifest.get("subject"), "streams": len(self.parts), "events": self.events,
                "batches": self.batches}


def _file_lines(path: Path, problems: list[str]) -> Iterator[tuple[int, bytes]]:
    try:
        with path.open("rb") as f:
            yield from enumerate(f, 1)
    except OSError as exc:
        problems.append(f"{path.name}: cannot be read ({exc})")


def verify_archive(directory: Path, *, public_key: Ed25519PublicKey | None = None) -> ArchiveCheck:
    """Every problem of the archive in ``directory`` (no database needed): its signature (with
    ``public_key``), the files against the manifest, every stream's chain from where its part
    starts, that each event decodes, each batch against its event and its payload's sha256,
    and the manifest's streams and counts."""
    try:
        body = (directory / "manifest.json").read_bytes()
        manifest = orjson.loads(body)
    except (OSError, orjson.JSONDecodeError) as exc:
        return ArchiveCheck(directory, {}, "", [f"manifest.json: cannot be read ({exc})"])
    check = ArchiveCheck(directory, manifest, hashlib.sha256(body).hexdigest())
    problems = check.problems
    if public_key is not None:
        problems += signature_problems(directory, body, public_key)
    if manifest.get("format") != FORMAT or (manifest.get("subject") or {}).get("kind") != KIND:
        problems.append("manifest.json: not an archive of a partition")
        return check
    claimed = {s.get("originator_id"): s for s in manifest.get("streams", [])}
    tails: dict[UUID, tuple[int, bytes]] = {}
    accepted: dict[str, dict[str, Any]] = {}
    broken: set[UUID] = set()
    events = _FileCheck("events.jsonl", manifest, problems)
    for number, raw in _file_lines(directory / "events.jsonl", problems):
        events.add(raw)
        try:
            line = orjson.loads(raw)
            oid = UUID(line["originator_id"])
            version = int(line["originator_version"])
            state = raw_state(line)
            prev_hash, stored = bytes.fromhex(line["prev_hash"]), bytes.fromhex(line["hash"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            problems.append(f"events.jsonl line {number}: not an event line ({exc})")
            continue
        check.events += 1
        prev = tails.get(oid)
        if prev is None:
            start = claimed.get(str(oid)) or {}
            if (start.get("first_version"), start.get("first_prev_hash")) != (version, line["prev_hash"]):
                problems.append(f"stream {oid} v{version}: the manifest says its part starts at"
                                f" v{start.get('first_version')}")
                broken.add(oid)
            prev = (version - 1, prev_hash) if version > 1 else None
        if oid not in broken:
            problem = check_link(prev, oid, version, line["topic"], state, prev_hash, stored)
            if problem is not None:
                problems.append(f"stream {oid} v{version}: {problem}")
                broken.add(oid)
        tails[oid] = (version, stored)
        first = check.parts.get(oid)
        check.parts[oid] = (first[0], first[1], version, stored) if first else (version, prev_hash, version, stored)
        try:
            decode_event(oid, version, line["topic"], state)
        except Exception as exc:  # any failure to decode is a finding, not a crash
            problems.append(f"stream {oid} v{version}: not a valid {line['topic'].rpartition(':')[2]} event"
                            f" ({type(exc).__name__})")
        if line["topic"].endswith(":ResultBatchAccepted") and isinstance(line.get("state"), dict):
            accepted[str(line["state"].get("batch_id"))] = line
    events.close()
    _check_streams(check, claimed)
    batches = _FileCheck("batches.jsonl", manifest, problems)
    seen: set[str] = set()
    for number, raw in _file_lines(directory / "batches.jsonl", problems):
        batches.add(raw)
        try:
            batch = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            problems.append(f"batches.jsonl line {number}: not JSON ({exc})")
            continue
        check.batches += 1
        seen.add(str(batch.get("batch_id")))
        problems.extend(_batch_line_problems(batch, accepted.get(str(batch.get("batch_id")))))
    batches.close()
    for bid in accepted.keys() - seen:
        problems.append(f"batch {bid}: accepted by an event but missing from batches.jsonl")
    counts = {"streams": len(check.parts), "events": check.events, "batches": check.batches}
    if manifest.get("counts") != counts:
        problems.append(f"counts are {counts}, the manifest says {manifest.get('counts')}")
    return check


def verify_bundle_or_archive(directory: Path, *, public_key: Ed25519PublicKey | None = None
                             ) -> tuple[dict[str, Any], list[str]]:
    """``replay verify-bundle``: an archive of a partition is verified as one (streamed, with
    parts of streams), any other bundle by :func:`replay.bundle.verify_bundle`."""
    try:
        kind = (orjson.loads((directory / "manifest.json").read_bytes()).get("subject") or {}).get("kind")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        kind = None
    if kind == KIND:
        check = verify_archive(directory, public_key=public_key)
        return check.summary(), check.problems
    return verify_bundle(directory, public_key=public_key)


class _FileCheck:
    """A file's sha256, size and line count, held against the manifest's entry when closed."""

    def __init__(self, name: str, manifest: dict[str, Any], problems: list[str]) -> None:
        self.name, self.expected, self.problems = name, manifest.get("files", {}).get(name), problems
        self.digest, self.size, self.lines = hashlib.sha256(), 0, 0

    def add(self, raw: bytes) -> None:
        self.digest.update(raw)
        self.size += len(raw)
        self.lines += raw.count(b"\n")

    def close(self) -> None:
        if self.expected is None:
            self.problems.append(f"{self.name}: not listed in the manifest")
            return
        actual = {"sha256": self.digest.hexdigest(), "bytes": self.size, "lines": self.lines}
        for key, value in actual.items():
            if self.expected.get(key) != value:
                self.problems.append(f"{self.name}: {key} is {value}, the manifest says {self.expected.get(key)}")


def _check_streams(check: ArchiveCheck, claimed: dict[str, dict[str, Any]]) -> None:
    for missing in claimed.keys() - {str(o) for o in check.parts}:
        check.problems.append(f"stream {missing}: in the manifest but has no events in the archive")
    for oid, (_, _, head_version, head_hash) in check.parts.items():
        stream = claimed.get(str(oid))
        if stream is None:
            check.problems.append(f"stream {oid}: has events but is not in the manifest")
        elif (stream.get("head_version"), stream.get("head_hash")) != (head_version, head_hash.hex()):
            check.problems.append(f"stream {oid}: ends at v{head_version} {head_hash.hex()[:16]}…, the manifest"
                                  f" says v{stream.get('head_version')} {str(stream.get('head_hash'))[:16]}…")


def _batch_line_problems(batch: dict[str, Any], event: dict[str, Any] | None) -> list[str]:
    bid = batch.get("batch_id")
    problems = batch_payload_problems(batch)
    if event is None:
        return [*problems, f"batch {bid}: no ResultBatchAccepted event in the archive"]
    state = event["state"]
    for key in ("payload_sha256", "sequence_number", "record_count", "final", "idempotency_key", "attempt_id"):
        if state.get(key) != batch.get(key):
            problems.append(f"batch {bid}: {key} is {batch.get(key)!r}, its event says {state.get(key)!r}")
    if (event["originator_id"], event["originator_version"], event["hash"]) != (
            batch.get("task_id"), batch.get("event_version"), batch.get("event_hash")):
        problems.append(f"batch {bid}: does not point at its event (task, version, hash)")
    return problems


# --- several archives and the live log -------------------------------------------------------


@dataclass(slots=True)
class ArchiveSet:
    """Archives verified one by one, then joined: each stream's parts must follow each other
    (oldest partition first). ``tails`` is where each stream ends in the archives: the live
    log's chain walk starts there."""

    checks: list[ArchiveCheck]
    problems: list[str] = field(default_factory=list)
    tails: dict[UUID, tuple[int, bytes]] = field(default_factory=dict)
    #: Streams whose part in an archive starts after v1 with no earlier part given.
    starts: dict[UUID, int] = field(default_factory=dict)

    @classmethod
    def load(cls, directories: list[Path], *, public_key: Ed25519PublicKey | None = None) -> ArchiveSet:
        checks = [verify_archive(d, public_key=public_key) for d in directories]
        result = cls(checks)
        for check in checks:
            result.problems += [f"archive {check.directory}: {p}" for p in check.problems]
        for check in sorted(checks, key=lambda c: c.upper_bound):
            for oid, (first_version, first_prev, head_version, head_hash) in check.parts.items():
                tail = result.tails.get(oid)
                expected = (tail[0] + 1, tail[1]) if tail else (1, bytes(32))
                if (first_version, first_prev) != expected:
                    where = (f"v{tail[0]} in an earlier archive" if tail
                             else "no earlier part in any archive given")
                    result.problems.append(f"archive {check.directory}: stream {oid} starts at v{first_version},"
                                           f" which does not follow its end ({where})")
                result.tails[oid] = (head_version, head_hash)
        return result

    @property
    def manifests(self) -> set[str]:
        return {c.manifest_sha256 for c in self.checks}

    def hashes_at(self, keys: set[tuple[UUID, int]]) -> dict[tuple[UUID, int], bytes]:
        """The hashes of the archived events at these (stream, version)s, read in one pass over
        each archive that holds any of them."""
        found: dict[tuple[UUID, int], bytes] = {}
        for check in self.checks:
            wanted = {(oid, v) for oid, v in keys
                      if (part := check.parts.get(oid)) is not None and part[0] <= v <= part[2]}
            if wanted:
                for row in archived_rows([check.directory], {oid for oid, _ in wanted}):
                    if (row.originator_id, row.originator_version) in wanted:
                        found[(row.originator_id, row.originator_version)] = row.hash
        return found


def archived_rows(directories: list[Path], ids: set[UUID]) -> list[StoredRow]:
    """The archived events of the streams ``ids``, as stored rows (in each archive's order)."""
    wanted = {str(i) for i in ids}
    out: list[StoredRow] = []
    for directory in directories:
        with (directory / "events.jsonl").open("rb") as f:
            for raw in f:
                line = orjson.loads(raw)
                if line["originator_id"] not in wanted:
                    continue
                out.append(StoredRow(
                    line["notification_id"], UUID(line["originator_id"]), line["originator_version"],
                    line["topic"], raw_state(line), datetime.fromisoformat(line["recorded_at"]),
                    int(line["transaction_id"]), bytes.fromhex(line["prev_hash"]), bytes.fromhex(line["hash"])))
    return out
