"""``replay export`` / ``replay verify-bundle``: an audit bundle that can be checked offline.

A bundle is a directory:

* ``events.jsonl`` — one line per stored event of the task (or of the scan and all its tasks),
  in log order, with every stored column: ``notification_id``, ``originator_id``,
  ``originator_version``, ``topic``, ``state`` (the JSON object), ``recorded_at``,
  ``transaction_id``, ``prev_hash`` and ``hash`` (hex). The chain hashes the exact stored bytes;
  those are ``orjson.dumps(state)`` (the one encoder that writes them), and a line carries
  ``state_raw_base64`` only when re-encoding would not give them back.
* ``batches.jsonl`` — one line per accepted result batch (from the ``ResultBatchAccepted``
  events), with its ``payload_sha256`` and the payload (the JSON records from
  ``result_payloads``; ``payload_raw_base64`` likewise only when needed).
* ``manifest.sig`` (when exported with ``--signing-key``) — ``{"format", "key_id", "signature"}``,
  the base64 Ed25519 signature of the exact bytes of ``manifest.json``; ``verify-bundle
  --public-key`` requires it, so a bundle whose lines were removed and manifest recomputed fails.
* ``manifest.json`` — what the bundle claims: the streams with their head version and hash,
  counts, the latest checkpoint's seal and its sealed heads of these streams, and the sha256,
  size and line count of each file.

``verify-bundle`` needs no database: it recomputes every stream's hash chain from the events
file, checks that each event decodes to a valid domain event, each payload's sha256, that
batches and ``ResultBatchAccepted`` events agree, the stream heads, counts and sealed heads
the manifest states, and the files' sha256.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from psycopg import AsyncConnection

from leasehold.domain.events import ResultBatchAccepted
from leasehold.persistence.chain import check_link
from leasehold.persistence.checkpoints import latest_checkpoint, sealed_heads
from leasehold.persistence.codec import decode_event
from leasehold.persistence.event_log import StoredRow, rows_of_streams, stream_rows
from leasehold.persistence.seals import key_id
from leasehold.persistence.transaction import Reader
from leasehold.replay.log import require_stream, scan_task_ids

FORMAT = "leasehold-audit-bundle/1"
SIGNATURE = "manifest.sig"
SIGNATURE_FORMAT = "leasehold-bundle-signature/1"
FILES = ("events.jsonl", "batches.jsonl")


@dataclass(slots=True)
class Exported:
    directory: Path
    streams: int
    events: int
    batches: int
    manifest_sha256: str
    chain_problems: list[str] = field(default_factory=list)


def _json_or_raw(raw: bytes, *, sort_keys: bool = False) -> tuple[Any, str | None]:
    """(the JSON value, base64 of the raw bytes if re-encoding the value would not give them back)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, base64.b64encode(raw).decode()
    option = orjson.OPT_SORT_KEYS if sort_keys else 0
    if orjson.dumps(value, option=option) == raw:
        return value, None
    return value, base64.b64encode(raw).decode()


def event_line(row: StoredRow) -> dict[str, Any]:
    state, raw = _json_or_raw(row.state)
    line: dict[str, Any] = {
        "notification_id": row.notification_id, "originator_id": str(row.originator_id),
        "originator_version": row.originator_version, "topic": row.topic, "state": state,
        "recorded_at": row.recorded_at.isoformat(), "transaction_id": row.transaction_id,
        "prev_hash": row.prev_hash.hex(), "hash": row.hash.hex(),
    }
    if raw is not None:
        line["state_raw_base64"] = raw
    return line


async def export_bundle(conn: AsyncConnection[Any], subject: UUID, kind: str, out: Path, *,
                        signing_key: Ed25519PrivateKey | None = None) -> Exported:
    """Write the bundle of a task (``kind="task"``) or scan (``"scan"``) into ``out`` (new or empty);
    with ``signing_key``, also ``manifest.sig`` (the manifest's Ed25519 signature).

    Reads everything in the caller's transaction: run it inside :func:`persistence.snapshot.snapshot`.
    """
    require_empty(out)
    if kind == "task":
        await require_stream(conn, subject, "TaskCreated")
        rows = await stream_rows(conn, subject)
        types = {subject: "task"}
    else:
        await require_stream(conn, subject, "ScanCreated")
        scan_rows = await stream_rows(conn, subject)
        task_ids = await scan_task_ids(conn, subject, scan_rows)
        rows = sorted(scan_rows + await rows_of_streams(conn, task_ids), key=lambda r: r.notification_id)
        types = {subject: "scan", **{t: "task" for t in task_ids}}
    batches = await batch_lines(conn, rows)
    files = _write_files(out, rows, batches)
    streams: dict[UUID, list[StoredRow]] = {}
    for row in rows:
        streams.setdefault(row.originator_id, []).append(row)
    now_row = await Reader(conn).one("snapshot_time", {})
    assert now_row is not None
    manifest = {
        "format": FORMAT,
        "created_at": now_row[0].isoformat(),
        "subject": {"kind": kind, "id": str(subject)},
        "streams": [
            {"originator_id": str(oid), "type": types.get(oid, "other"), "events": len(srows),
             "head_version": srows[-1].originator_version, "head_hash": srows[-1].hash.hex()}
            for oid, srows in streams.items()],
        "counts": {"streams": len(streams), "events": len(rows), "batches": len(batches)},
        "checkpoint": await _checkpoint_section(conn, list(streams)),
        "files": files,
    }
    body = orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    _write_manifest(out, body)
    if signing_key is not None:
        (out / SIGNATURE).write_bytes(orjson.dumps({
            "format": SIGNATURE_FORMAT, "key_id": key_id(signing_key.public_key()),
            "signature": base64.b64encode(signing_key.sign(body)).decode()}, option=orjson.OPT_INDENT_2))
    problems = _chain_problems(event_line(r) for r in rows)
    return Exported(out, len(streams), len(rows), len(batches), hashlib.sha256(body).hexdigest(), problems)


async def batch_lines(conn: AsyncConnection[Any], rows: list[StoredRow]) -> list[dict[str, Any]]:
    accepted = [(row, event) for row in rows
                if row.event_type == "ResultBatchAccepted" and isinstance(event := row.decode(), ResultBatchAccepted)]
    found = await Reader(conn).all("payloads_by_sha256", {"sha256s": sorted({e.payload_sha256 for _, e in accepted})})
    bodies = {sha: bytes(body) for sha, body in found}
    lines = []
    for row, event in accepted:
        line: dict[str, Any] = {
            "task_id": str(event.originator_id), "attempt_id": str(event.attempt_id),
            "batch_id": str(event.batch_id), "sequence_number": event.sequence_number,
            "idempotency_key": event.idempotency_key, "record_count": event.record_count,
            "final": event.final, "accepted_at": event.timestamp.isoformat(),
            "event_version": row.originator_version, "event_hash": row.hash.hex(),
            "payload_sha256": event.payload_sha256,
        }
        body = bodies.get(event.payload_sha256)
        if body is None:
            line["payload"] = None
            line["payload_missing"] = True
        else:
            payload, raw = _json_or_raw(body, sort_keys=True)
            line["payload"] = payload
            line["payload_bytes"] = len(body)
            if raw is not None:
                line["payload_raw_base64"] = raw
        lines.append(line)
    return lines


async def _checkpoint_section(conn: AsyncConnection[Any], streams: list[UUID]) -> dict[str, Any] | None:
    latest = await latest_checkpoint(conn)
    if latest is None:
        return None
    heads = {str(oid): {"version": head.version, "hash": head.hash.hex(), "checkpoint_id": checkpoint_id}
             for oid, (head, checkpoint_id) in (await sealed_heads(conn, streams)).items()}
    return {"id": latest.id, "created_at": latest.created_at.isoformat(), "seal": latest.seal.hex(),
            "head_count": latest.head_count, "event_count": latest.event_count, "sealed_heads": heads}


def require_empty(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory")


def _write_files(out: Path, rows: list[StoredRow], batches: list[dict[str, Any]]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    return {
        "events.jsonl": _write_lines(out / "events.jsonl", (event_line(r) for r in rows)),
        "batches.jsonl": _write_lines(out / "batches.jsonl", batches),
    }


def _write_manifest(out: Path, body: bytes) -> None:
    (out / "manifest.json").write_bytes(body)


def _write_lines(path: Path, lines: Iterable[dict[str, Any]]) -> dict[str, Any]:
    digest = hashlib.sha256()
    count = size = 0
    with path.open("wb") as f:
        for line in lines:
            data = orjson.dumps(line) + b"\n"
            f.write(data)
            digest.update(data)
            count += 1
            size += len(data)
    return {"sha256": digest.hexdigest(), "bytes": size, "lines": count}


# --- verification (offline) ------------------------------------------------------------------


def raw_state(line: dict[str, Any]) -> bytes:
    if "state_raw_base64" in line:
        return base64.b64decode(line["state_raw_base64"])
    return orjson.dumps(line["state"])


def _chain_problems(lines: Iterable[dict[str, Any]]) -> list[str]:
    """The first broken link of each stream, recomputed from event lines (any order)."""
    streams: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        streams.setdefault(line["originator_id"], []).append(line)
    problems = []
    for oid, slines in streams.items():
        prev: tuple[int, bytes] | None = None
        for line in sorted(slines, key=lambda x: x["originator_version"]):
            version = line["originator_version"]
            problem = check_link(prev, UUID(oid), version, line["topic"], raw_state(line),
                                 bytes.fromhex(line["prev_hash"]), bytes.fromhex(line["hash"]))
            if problem is not None:
                problems.append(f"stream {oid} v{version}: {problem}")
                break
            prev = (version, bytes.fromhex(line["hash"]))
    return problems


def verify_bundle(directory: Path, *, public_key: Ed25519PublicKey | None = None
                  ) -> tuple[dict[str, Any], list[str]]:
    """(a summary, every problem found) for the bundle in ``directory``; no database needed.
    With ``public_key``, ``manifest.sig`` must be a valid signature of ``manifest.json`` by it."""
    problems: list[str] = []
    try:
        body = (directory / "manifest.json").read_bytes()
        manifest = orjson.loads(body)
    except (OSError, orjson.JSONDecodeError) as exc:
        return {}, [f"manifest.json: cannot be read ({exc})"]
    if public_key is not None:
        problems += signature_problems(directory, body, public_key)
    if manifest.get("format") != FORMAT:
        problems.append(f"manifest.json: unknown format {manifest.get('format')!r}")
    contents: dict[str, bytes] = {}
    for name in FILES:
        expected = manifest.get("files", {}).get(name)
        try:
            data = (directory / name).read_bytes()
        except OSError as exc:
            problems.append(f"{name}: cannot be read ({exc})")
            continue
        contents[name] = data
        if expected is None:
            problems.append(f"{name}: not listed in the manifest")
            continue
        actual = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "lines": data.count(b"\n")}
        for key, value in actual.items():
            if expected.get(key) != value:
                problems.append(f"{name}: {key} is {value}, the manifest says {expected.get(key)}")
    events = _parse_lines("events.jsonl", contents.get("events.jsonl", b""), problems)
    batches = _parse_lines("batches.jsonl", contents.get("batches.jsonl", b""), problems)
    problems += _chain_problems(events)
    problems += _event_problems(events)
    problems += _stream_problems(manifest, events)
    problems += _batch_problems(batches, events)
    counts = {"streams": len({e["originator_id"] for e in events}), "events": len(events), "batches": len(batches)}
    if manifest.get("counts") != counts:
        problems.append(f"counts are {counts}, the manifest says {manifest.get('counts')}")
    return {"subject": manifest.get("subject"), **counts}, problems


def signature_problems(directory: Path, body: bytes, public_key: Ed25519PublicKey) -> list[str]:
    try:
        sig = orjson.loads((directory / SIGNATURE).read_bytes())
        signature = base64.b64decode(sig["signature"], validate=True)
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return [f"{SIGNATURE}: missing or unreadable ({exc}); the manifest is not signed"]
    if sig.get("key_id") != key_id(public_key):
        return [f"{SIGNATURE}: signed with key {sig.get('key_id')!r}, not with the given public key"]
    try:
        public_key.verify(signature, body)
    except InvalidSignature:
        return [f"{SIGNATURE}: the signature does not match manifest.json (the manifest was changed)"]
    return []


def _parse_lines(name: str, data: bytes, problems: list[str]) -> list[dict[str, Any]]:
    out = []
    for number, raw in enumerate(data.splitlines(), 1):
        try:
            out.append(orjson.loads(raw))
        except orjson.JSONDecodeError as exc:
            problems.append(f"{name} line {number}: not JSON ({exc})")
    return out


def _event_problems(events: list[dict[str, Any]]) -> list[str]:
    problems = []
    for line in events:
        raw = raw_state(line)
        if "state_raw_base64" in line and line.get("state") is not None and orjson.loads(raw) != line["state"]:
            problems.append(f"stream {line['originator_id']} v{line['originator_version']}:"
                            " state and state_raw_base64 disagree")
        try:
            decode_event(UUID(line["originator_id"]), line["originator_version"], line["topic"], raw)
        except Exception as exc:  # any failure to decode is a finding, not a crash
            problems.append(f"stream {line['originator_id']} v{line['originator_version']}:"
                            f" not a valid {line['topic'].rpartition(':')[2]} event ({type(exc).__name__})")
    return problems


def _stream_problems(manifest: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    problems = []
    by_stream: dict[str, dict[int, dict[str, Any]]] = {}
    for line in events:
        by_stream.setdefault(line["originator_id"], {})[line["originator_version"]] = line
    claimed = {s["originator_id"]: s for s in manifest.get("streams", [])}
    for oid in claimed.keys() - by_stream.keys():
        problems.append(f"stream {oid}: in the manifest but has no events in the bundle")
    for oid, versions in by_stream.items():
        stream = claimed.get(oid)
        if stream is None:
            problems.append(f"stream {oid}: has events but is not in the manifest")
            continue
        head = versions[max(versions)]
        if (stream.get("head_version"), stream.get("head_hash"), stream.get("events")) != (
                head["originator_version"], head["hash"], len(versions)):
            problems.append(f"stream {oid}: head v{head['originator_version']} {head['hash'][:16]}… "
                            f"({len(versions)} events), the manifest says v{stream.get('head_version')} "
                            f"{str(stream.get('head_hash'))[:16]}… ({stream.get('events')} events)")
    checkpoint: dict[str, Any] = manifest.get("checkpoint") or {}
    sealed = checkpoint.get("sealed_heads", {})
    for oid, head in sealed.items():
        at_version = by_stream.get(oid, {}).get(head["version"])
        if at_version is None:
            problems.append(f"stream {oid}: checkpoint {head['checkpoint_id']} sealed v{head['version']},"
                            " which the bundle does not contain")
        elif at_version["hash"] != head["hash"]:
            problems.append(f"stream {oid} v{head['version']}: hash differs from the one checkpoint"
                            f" {head['checkpoint_id']} sealed")
    return problems


def batch_payload_problems(batch: dict[str, Any]) -> list[str]:
    """What is wrong with one exported batch line's payload: missing from the database when it was
    exported, or not hashing to the sha256 its row recorded (empty when neither)."""
    bid = batch.get("batch_id")
    if batch.get("payload_missing"):
        return [f"batch {bid}: its payload {batch.get('payload_sha256')} is missing from the database"]
    raw = (base64.b64decode(batch["payload_raw_base64"]) if "payload_raw_base64" in batch
           else orjson.dumps(batch.get("payload"), option=orjson.OPT_SORT_KEYS))
    if hashlib.sha256(raw).hexdigest() != batch.get("payload_sha256"):
        return [f"batch {bid}: payload sha256 is {hashlib.sha256(raw).hexdigest()},"
                f" recorded {batch.get('payload_sha256')}"]
    return []


def _batch_problems(batches: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[str]:
    problems = []
    accepted = {}
    for line in events:
        if line["topic"].endswith(":ResultBatchAccepted") and isinstance(line.get("state"), dict):
            accepted[line["state"].get("batch_id")] = (line, line["state"])
    seen = set()
    for batch in batches:
        bid = batch.get("batch_id")
        seen.add(bid)
        problems.extend(batch_payload_problems(batch))
        match = accepted.get(bid)
        if match is None:
            problems.append(f"batch {bid}: no ResultBatchAccepted event in the bundle")
            continue
        line, state = match
        for key in ("payload_sha256", "sequence_number", "record_count", "final", "idempotency_key", "attempt_id"):
            if state.get(key) != batch.get(key):
                problems.append(f"batch {bid}: {key} is {batch.get(key)!r}, its event says {state.get(key)!r}")
        if (line["originator_id"], line["originator_version"], line["hash"]) != (
                batch.get("task_id"), batch.get("event_version"), batch.get("event_hash")):
            problems.append(f"batch {bid}: does not point at its event (task, version, hash)")
    for bid in accepted.keys() - seen:
        problems.append(f"batch {bid}: accepted by an event but missing from batches.jsonl")
    return problems
