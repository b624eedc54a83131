"""Signed seals: checkpoints signed with a key the database never sees, published outside it.

A checkpoint (:mod:`persistence.checkpoints`) lives in the database it vouches for: whoever can
rewrite the database can rewrite it too. A *seal* makes it evidence. Each checkpoint becomes a
digest record, signed with an Ed25519 key that only the sealing process holds (a PEM file; the
database sees neither key nor signature), and appended to a **digest sink** outside PostgreSQL
(by default a directory of JSON lines, one file per UTC day: :class:`DirectorySink`). An auditor
who keeps the sink and the public key can later tell, for every event up to the newest digest,
whether it was added, removed, altered or reordered (``leasehold replay verify-chain --digests``).

A digest record (one JSON line)::

    {"format": "leasehold-digest/1", "checkpoint_id": 7, "created_at": "…", "transaction_xmin": 1234,
     "position": 5120, "head_count": 40, "event_count": 5120, "changed": [[stream, version, hash], …],
     "prev_seal": "…", "seal": "…", "key_id": "…", "signature": "…"}

``changed`` are the heads that changed since the previous checkpoint (so the full head set at a
record is the fold of every record up to it), ``seal`` is the checkpoint's seal over exactly
those fields (:func:`persistence.checkpoints.seal_of`), ``position`` the highest
``notification_id`` in the sealing snapshot (``null`` on records caught up from the database),
``key_id`` the first 16 bytes of sha256 of the raw public key, in hex, and ``signature`` the
base64 Ed25519 signature of the record without ``signature``, serialised as JSON with sorted
keys and no spaces (:func:`signed_bytes`).

:func:`seal_now` writes a checkpoint and then appends to the sink every checkpoint the sink
does not have yet, in order (normally just that one; after a failed append, the ones it missed),
all under the sink's lock, so records are in checkpoint order and none is missed or repeated,
from any number of processes sharing the sink.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import hashlib
import logging
import os
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from uuid import UUID

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from psycopg import AsyncConnection, sql

from leasehold.persistence.checkpoints import CHECKPOINT_COLUMNS as _COLUMNS
from leasehold.persistence.checkpoints import (
    Checkpoint,
    Head,
    checkpoint_from_row,
    head_from_row,
    write_checkpoint,
)
from leasehold.persistence.rows import execute_named

logger = logging.getLogger(__name__)

FORMAT = "leasehold-digest/1"


# --- keys ------------------------------------------------------------------------------------


class SealKeyError(ValueError):
    """A key file that cannot be used."""


def generate_keypair(private_path: Path, public_path: Path) -> str:
    """Write a new Ed25519 key pair (PKCS#8 PEM, private file mode 0600); returns the key id.
    Refuses to overwrite either file."""
    for path in (private_path, public_path):
        if path.exists():
            raise FileExistsError(f"{path} exists; refusing to overwrite a key")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_pem)
    public_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo))
    return key_id(key.public_key())


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise SealKeyError(f"{path}: not a readable unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SealKeyError(f"{path}: not an Ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise SealKeyError(f"{path}: not a readable PEM public key ({exc})") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise SealKeyError(f"{path}: not an Ed25519 public key")
    return key


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:32]


def signed_bytes(record: dict[str, Any]) -> bytes:
    """What a record's signature covers: the record without ``signature``, sorted-key JSON."""
    return orjson.dumps({k: v for k, v in record.items() if k != "signature"}, option=orjson.OPT_SORT_KEYS)


def sign_record(record: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    signed = {**record, "key_id": key_id(key.public_key())}
    signed["signature"] = base64.b64encode(key.sign(signed_bytes(signed))).decode()
    return signed


def signature_problem(record: dict[str, Any], public_key: Ed25519PublicKey) -> str | None:
    """Why the record's signature does not hold under ``public_key``, or None when it does."""
    if record.get("key_id") != key_id(public_key):
        return f"signed with key {record.get('key_id')!r}, not with the given public key ({key_id(public_key)})"
    try:
        public_key.verify(base64.b64decode(str(record.get("signature", "")), validate=True), signed_bytes(record))
    except (InvalidSignature, ValueError):
        return "the signature does not match the record (edited or forged)"
    return None


# --- records ---------------------------------------------------------------------------------


def record_of(checkpoint: Checkpoint, changed: list[Head], position: int | None) -> dict[str, Any]:
    """The (unsigned) digest record of a checkpoint and its changed heads."""
    return {
        "format": FORMAT, "checkpoint_id": checkpoint.id, "created_at": checkpoint.created_at.isoformat(),
        "transaction_xmin": checkpoint.transaction_xmin, "position": position,
        "head_count": checkpoint.head_count, "event_count": checkpoint.event_count,
        "changed": [[str(h.originator_id), h.version, h.hash.hex()]
                    for h in sorted(changed, key=lambda x: x.originator_id.bytes)],
        "prev_seal": checkpoint.prev_seal.hex(), "seal": checkpoint.seal.hex(),
    }


def heads_of(record: dict[str, Any]) -> list[Head]:
    return [Head(UUID(oid), int(version), bytes.fromhex(h)) for oid, version, h in record["changed"]]


# --- sinks -----------------------------------------------------------------------------------


class DigestSink(Protocol):
    """Where digest records are published: append-only storage outside the database.

    ``append`` must be durable when it returns; ``try_lock`` takes an exclusive lock shared by
    every process appending to the same sink without waiting (a token, or None when another holds
    it) and ``unlock`` gives it back; ``records`` yields (where, record) in append order; ``last``
    the last record appended (None when empty).
    """

    def append(self, record: dict[str, Any]) -> None: ...

    def last(self) -> dict[str, Any] | None: ...

    def records(self) -> Iterator[tuple[str, dict[str, Any]]]: ...

    def try_lock(self) -> object | None: ...

    def unlock(self, token: object) -> None: ...


class DirectorySink:
    """The default sink: ``DIR/digests-YYYY-MM-DD.jsonl`` (UTC day of the record), one record per
    line, appended with ``O_APPEND`` and fsynced; ``DIR/.lock`` (flock) serialises writers.

    Point it at storage the database host cannot rewrite (a WORM bucket mount, another host's
    share, a directory shipped off the machine): the files are only ever appended to.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def _files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob("digests-*.jsonl"))

    def append(self, record: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        day = datetime.fromisoformat(record["created_at"]).astimezone(UTC).date().isoformat()
        line = orjson.dumps(record) + b"\n"
        fd = os.open(self.directory / f"digests-{day}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def last(self) -> dict[str, Any] | None:
        for path in reversed(self._files()):
            raw = _last_line(path)
            if raw:
                value: dict[str, Any] = orjson.loads(raw)
                return value
        return None

    def records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for path in self._files():
            for number, raw in enumerate(path.read_bytes().splitlines(), 1):
                if not raw.strip():
                    continue
                try:
                    value = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    value = {"unreadable": raw.decode(errors="replace")[:200]}
                yield f"{path.name}:{number}", value

    def try_lock(self) -> object | None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def unlock(self, token: object) -> None:
        assert isinstance(token, int)
        os.close(token)  # releases the lock


def _last_line(path: Path, block: int = 65536) -> bytes:
    """The last non-empty line of a file, read backwards from its end (a day's file can hold
    thousands of records, the first seal of a large log megabytes)."""
    with path.open("rb") as f:
        end = f.seek(0, os.SEEK_END)
        tail = b""
        position = end
        while position > 0:
            step = min(block, position)
            position -= step
            f.seek(position)
            tail = f.read(step) + tail
            stripped = tail.rstrip(b"\n")
            cut = stripped.rfind(b"\n")
            if cut >= 0:
                return stripped[cut + 1:]
        return tail.strip(b"\n")


def open_sink(location: str | Path) -> DigestSink:
    """The sink at ``location``: a directory path (the only built-in kind; another kind plugs in
    by implementing :class:`DigestSink` and passing it to :class:`Sealer`)."""
    return DirectorySink(Path(location))


# --- sealing ---------------------------------------------------------------------------------


_AFTER = sql.SQL("SELECT {} FROM checkpoints WHERE id > %s ORDER BY id").format(_COLUMNS)
_HEADS = "SELECT originator_id, originator_version, hash FROM checkpoint_heads WHERE checkpoint_id = %s"


class Sealer:
    """Seals with one key into one sink; :meth:`seal` is safe from several coroutines and processes."""

    def __init__(self, key: Ed25519PrivateKey, sink: DigestSink) -> None:
        self.key = key
        self.sink = sink
        self._lock = asyncio.Lock()

    async def seal(self, conn: AsyncConnection[Any], *, unless_newer_than: float | None = None) -> dict[str, Any]:
        """Write a checkpoint, publish it (and any checkpoint the sink misses); the new record.

        ``conn`` must be idle (see :func:`persistence.checkpoints.write_checkpoint`). With
        ``unless_newer_than`` (seconds), a sink whose last record is younger than that is left
        alone and that record returned: the periodic loops of several processes sharing a sink
        then seal about once per interval between them, not once each.
        """
        async with self._lock, _held(self.sink):
            if unless_newer_than is not None:
                recent = await asyncio.to_thread(self.sink.last)
                if recent is not None and (datetime.now(UTC) - datetime.fromisoformat(recent["created_at"])
                                           ).total_seconds() < unless_newer_than:
                    return recent
            checkpoint = await write_checkpoint(conn)
            last = await asyncio.to_thread(self.sink.last)
            after = int(last["checkpoint_id"]) if last else 0
            expected_prev = last["seal"] if last else bytes(32).hex()
            published: dict[str, Any] | None = None
            async with conn.transaction():
                cur = await execute_named(conn, _AFTER, (after,))
                pending = [checkpoint_from_row(r) for r in await cur.fetchall()]
                for cp in pending:
                    if cp.prev_seal.hex() != expected_prev:
                        logger.error("checkpoint %d does not continue the digest sink (its prev_seal is not the"
                                     " last published seal): a checkpoint was removed or rewritten in the"
                                     " database; publishing it, verify-chain --digests will report the break",
                                     cp.id)
                    heads_cur = await execute_named(conn, _HEADS, (cp.id,), binary=True)
                    heads = [head_from_row(r) for r in await heads_cur.fetchall()]
                    position = checkpoint.position if cp.id == checkpoint.id else None
                    published = sign_record(record_of(cp, heads, position), self.key)
                    await asyncio.to_thread(self.sink.append, published)
                    expected_prev = cp.seal.hex()
            if published is None:
                raise RuntimeError(f"checkpoint {checkpoint.id} was not published: the sink is ahead of the"
                                   " database (its checkpoints were removed?)")
            return published


@contextlib.asynccontextmanager
async def _held(sink: DigestSink) -> AsyncIterator[None]:
    """The sink's cross-process lock, polled without blocking the event loop (and safe to cancel
    while waiting: nothing is held until ``try_lock`` succeeds)."""
    token = sink.try_lock()
    while token is None:  # another process holds it: a flock has nothing to await
        await asyncio.sleep(0.005)
        token = sink.try_lock()
    try:
        yield
    finally:
        sink.unlock(token)
