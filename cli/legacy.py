"""``leasehold legacy drain``: move the legacy Redis scan queue's messages into Gateway scans.

The legacy API pushed one message per scan onto a Redis list (``LPUSH``) and the legacy worker
took them from the other end (``BRPOP``). The drain reads them in the same order and, for each
(message format: :mod:`domain.legacy`; decisions: :mod:`gateway.commands.legacy`):

1. moves it atomically to ``<queue>:processing`` (``LMOVE queue processing RIGHT LEFT``), so a
   crash never loses it;
2. converts it in one database transaction: a Gateway scan keyed on the legacy scan id (unique
   among Gateway scans), its first step's task included;
3. after the commit, removes it from ``<queue>:processing`` — or moves it (``LPUSH`` + ``LREM``
   in one ``MULTI``) to ``<queue>:refused`` when the scan already started in either mode, to
   ``<queue>:dead`` when the message cannot be read (not JSON, a wrong or missing field, a NUL
   character, which PostgreSQL cannot store), or to ``<queue>:invalid`` when it reads but cannot
   be converted (an unknown organisation or profile…). Nothing is dropped; every decision is
   printed, and the drain goes on with the next message.

``leasehold legacy dead-letters list`` shows the dead letters (why each one is there: the hash
``<queue>:dead:reasons``, by the message's sha256), ``leasehold legacy dead-letters requeue``
puts them back on the queue (all of them, or those whose sha256 starts with ``--sha256``) once
the producer is fixed.

On start it first re-handles what a previous run left in ``<queue>:processing``: a message
whose scan that run already committed is recognised (same legacy id and message sha256) and
only removed. So running it twice, or after a crash between the commit and the removal, creates
each scan once. ``--dry-run`` reads both lists without changing them and rolls every
transaction back. Exit status: 0 when the queue is drained (refused, dead and invalid messages
included), 1 when Redis or PostgreSQL cannot be reached (what is left stays in the lists), 2 for a
usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TextIO
from uuid import UUID

import orjson
import redis.asyncio as redis
from psycopg import AsyncConnection, DataError, OperationalError
from psycopg_pool import PoolTimeout

from leasehold.cli.dburl import add_database_options, resolve_database_url
from leasehold.cli.embedded import redact_url
from leasehold.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from leasehold.domain.admission import AdmissionRefused
from leasehold.domain.errors import Conflict, LeaseholdError, Unavailable
from leasehold.domain.legacy import InvalidMessage, parse_message
from leasehold.gateway.commands.legacy import Conversion, LegacyScans
from leasehold.gateway.services import build_services
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database

__all__ = ["drain", "register"]

PROGRESS_EVERY = 100
_LABELS = {"converted": "converted", "already_converted": "already converted", "refused": "refused",
           "invalid": "invalid", "dead": "dead"}
_VERBS = {"converted": "converted", "already_converted": "already converted", "refused": "refused",
          "invalid": "invalid", "dead": "dead-lettered"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``legacy`` command group (``drain``) to the ``leasehold`` CLI."""
    legacy = subparsers.add_parser("legacy", help="the legacy Redis scan queue (moving it to the Gateway)",
                                   description="Tools for the migration from the legacy Redis scan queue.")
    commands = legacy.add_subparsers(dest="legacy_command", metavar="COMMAND", required=True)
    drain_parser = commands.add_parser(
        "drain", help="move queued legacy scan messages into Gateway scans",
        description="Move the messages of the legacy scan queue (a Redis list: producers LPUSH, the "
                    "consumer pops from the right) into Gateway scans, idempotently. Messages whose "
                    "scan already started go to QUEUE:refused, unreadable ones (not JSON, a wrong or missing "
                    "field, a NUL character) to QUEUE:dead (see `leasehold legacy dead-letters`), ones naming an "
                    "unknown organisation or profile to QUEUE:invalid; QUEUE:processing holds the message "
                    "being handled.")
    drain_parser.add_argument("--redis-url", required=True, metavar="URL", help="redis:// URL of the legacy queue")
    drain_parser.add_argument("--queue", required=True, metavar="NAME", help="the Redis list the legacy API pushes to")
    add_database_options(drain_parser)
    drain_parser.add_argument("--dry-run", action="store_true",
                              help="report what would happen; change nothing in Redis or PostgreSQL")
    drain_parser.add_argument("--limit", type=int, metavar="N", help="handle at most N messages, then stop")
    drain_parser.set_defaults(func=_drain_command)

    dead = commands.add_parser(
        "dead-letters", help="messages the drain could not read (QUEUE:dead): list them, requeue them",
        description="Messages the drain could not read (not JSON, a wrong or missing field, a NUL character) "
                    "wait in the Redis list QUEUE:dead, each with its reason in the hash QUEUE:dead:reasons.")
    dead_commands = dead.add_subparsers(dest="dead_command", metavar="ACTION", required=True)
    for action, text in (("list", "print each dead letter: its sha256, size, reason and first bytes"),
                         ("requeue", "move dead letters back onto the queue (after fixing the producer)")):
        p = dead_commands.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("--redis-url", required=True, metavar="URL", help="redis:// URL of the legacy queue")
        p.add_argument("--queue", required=True, metavar="NAME", help="the Redis list the legacy API pushes to")
        if action == "list":
            p.add_argument("--json", action="store_true", help="print one JSON object per dead letter")
        else:
            chosen = p.add_mutually_exclusive_group(required=True)
            chosen.add_argument("--all", action="store_true", help="requeue every dead letter")
            chosen.add_argument("--sha256", metavar="PREFIX", help="requeue those whose sha256 starts with PREFIX")
        p.set_defaults(func=_dead_letters_command)


def _drain_command(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise CommandError("--limit must be at least 1", EXIT_USAGE)
    if not args.queue.strip():
        raise CommandError("--queue must name a Redis list", EXIT_USAGE)
    asyncio.run(_run(args))
    return EXIT_OK


@dataclass(frozen=True, slots=True)
class Lists:
    queue: str

    @property
    def processing(self) -> str:
        return f"{self.queue}:processing"

    @property
    def refused(self) -> str:
        return f"{self.queue}:refused"

    @property
    def invalid(self) -> str:
        return f"{self.queue}:invalid"

    @property
    def dead(self) -> str:
        return f"{self.queue}:dead"

    @property
    def reasons(self) -> str:
        return f"{self.queue}:dead:reasons"


async def _run(args: argparse.Namespace) -> None:
    url = resolve_database_url(args.database_url, embedded=args.embedded)
    client = redis.Redis.from_url(args.redis_url, socket_connect_timeout=10, socket_timeout=30)
    try:
        try:
            await client.ping()
        except redis.RedisError as exc:
            raise CommandError(f"cannot reach Redis at {redact_url(args.redis_url)}: {exc}") from exc
        try:  # one plain connection first: a refusal is reported at once, not after the pool's retries
            await (await AsyncConnection.connect(url, connect_timeout=10)).close()
        except OperationalError as exc:
            raise CommandError(f"cannot reach PostgreSQL at {redact_url(url)}: {exc}") from exc
        pool = create_pool(url, min_size=1, max_size=2, timeout=30)
        try:
            await pool.open(wait=True, timeout=30)
        except PoolTimeout as exc:
            raise CommandError(f"cannot reach PostgreSQL at {redact_url(url)}") from exc
        try:
            await drain(client, build_services(Database(pool)).legacy, args.queue, dry_run=args.dry_run, limit=args.limit)
        except redis.RedisError as exc:
            raise CommandError(f"lost Redis at {redact_url(args.redis_url)}: {exc} (the message being handled, "
                               f"if any, stays in {args.queue}:processing; run the drain again)") from exc
        finally:
            await pool.close()
    finally:
        await client.aclose()


async def drain(client: Any, legacy: LegacyScans, queue: str, *, dry_run: bool = False, limit: int | None = None,
                out: TextIO | None = None, err: TextIO | None = None) -> Counter[str]:
    """Drain ``queue`` with the ``redis.asyncio`` client; the counts per outcome."""
    out, err = out or sys.stdout, err or sys.stderr
    lists = Lists(queue)
    counts: Counter[str] = Counter()
    #: dry run: (organisation, legacy id) -> sha256 of the message that would convert it
    converting: dict[tuple[UUID, str], str] = {}
    verb = "would be " if dry_run else ""
    source = _peek(client, lists) if dry_run else _take(client, lists)
    while limit is None or sum(counts.values()) < limit:
        item = await anext(source, None)
        if item is None:
            break
        raw, recovering = item
        number = sum(counts.values()) + 1
        outcome: str
        reason = _unreadable(raw)
        if reason is None:
            try:
                message = parse_message(raw)
            except InvalidMessage as exc:
                reason = exc.message
        if reason is not None:
            outcome, text = "dead", f"{_described(raw)}: {reason}"
        else:
            try:
                key = (message.organization_id, message.legacy_scan_id)  # legacy ids: unique per organisation
                if key in converting:
                    conversion = _again(converting[key] == message.sha256)
                else:
                    conversion = await legacy.convert(message, recovering=recovering, dry_run=dry_run)
                    if dry_run and conversion.outcome == "converted":
                        converting[key] = message.sha256
                outcome, text = conversion.outcome, f"legacy scan {message.legacy_scan_id}: {conversion.reason}"
            except (Unavailable, Conflict, AdmissionRefused) as exc:  # gone, a race, a full queue: try again
                raise CommandError(f"{exc.message} (legacy scan {message.legacy_scan_id} stays in "
                                   f"{lists.processing}; run the drain again)") from exc
            except LeaseholdError as exc:  # an unknown organisation or profile, steps a rule refuses…
                outcome, text = "invalid", f"legacy scan {message.legacy_scan_id}: {_explain(exc)}"
            except DataError as exc:  # a value PostgreSQL cannot store: the message cannot be read
                reason = f"PostgreSQL cannot store a value of it ({exc.sqlstate})"
                outcome, text = "dead", f"{_described(raw)}: {reason}"
        target = {"refused": lists.refused, "invalid": lists.invalid, "dead": lists.dead}.get(outcome)
        if not dry_run:
            await _acknowledge(client, lists, raw, target, reason=reason if outcome == "dead" else None)
        counts[outcome] += 1
        moved = f" -> {verb}moved to {target}" if target else ""
        print(f"#{number} {verb}{_VERBS[outcome]}: {text}{moved}", file=out, flush=True)
        if number % PROGRESS_EVERY == 0:
            print(f"{number} messages so far: {_summary(counts)}", file=err, flush=True)
    total = sum(counts.values())
    prefix = "dry run, nothing changed" if dry_run else "done"
    print(f"{prefix}: {total} message{'' if total == 1 else 's'} from {queue}: {_summary(counts)}"
          + (f"; see {lists.refused}" if counts["refused"] else "")
          + (f"; see {lists.invalid}" if counts["invalid"] else "")
          + (f"; see {lists.dead} (leasehold legacy dead-letters list)" if counts["dead"] else ""),
          file=out, flush=True)
    return counts


def _unreadable(raw: bytes) -> str | None:
    """Why a message cannot be read before it is parsed, if it cannot: a NUL character in any of
    its strings (PostgreSQL stores none)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None  # parse_message says why
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return "a string holds a NUL character (U+0000), which PostgreSQL cannot store"
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return None


def _described(raw: bytes) -> str:
    """A message named without its content (which may hold what a log must not): size and sha256."""
    return f"message of {len(raw)} bytes, sha256 {hashlib.sha256(raw).hexdigest()[:16]}"


def _again(same_message: bool) -> Conversion:
    """Dry run: a later message for a legacy id that an earlier message of the run would convert."""
    if same_message:
        return Conversion("already_converted", "would already be converted by an earlier copy of this message")
    return Conversion("refused", "an earlier message of the queue would already make its Gateway scan")


def _explain(exc: LeaseholdError) -> str:
    details = ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in exc.details.items())
    return f"{exc.message} ({details})" if details else exc.message


def _summary(counts: Counter[str]) -> str:
    return ", ".join(f"{counts[k]} {label}" for k, label in _LABELS.items())


def _preview(raw: bytes) -> str:
    text = raw[:80].decode("utf-8", "replace")
    return repr(text + ("…" if len(raw) > 80 else ""))


async def _take(client: Any, lists: Lists) -> AsyncIterator[tuple[bytes, bool]]:
    """Messages to handle, oldest first: what a previous run left in the processing list, then
    the queue's, each moved to the processing list before it is handed out."""
    while True:
        raw = await client.lindex(lists.processing, -1)
        recovering = raw is not None
        if raw is None:
            raw = await client.lmove(lists.queue, lists.processing, "RIGHT", "LEFT")
            if raw is None:
                return
        yield raw, recovering


async def _acknowledge(client: Any, lists: Lists, raw: bytes, target: str | None, *,
                       reason: str | None = None) -> None:
    """The message is dealt with (its transaction committed): off the processing list, onto
    ``target`` if any (a dead letter with its reason), atomically."""
    async with client.pipeline(transaction=True) as pipe:
        if target is not None:
            pipe.lpush(target, raw)
        if reason is not None:
            pipe.hset(lists.reasons, hashlib.sha256(raw).hexdigest(), reason)
        pipe.lrem(lists.processing, -1, raw)
        await pipe.execute()


def _dead_letters_command(args: argparse.Namespace) -> int:
    if not args.queue.strip():
        raise CommandError("--queue must name a Redis list", EXIT_USAGE)
    asyncio.run(_dead_letters(args))
    return EXIT_OK


async def _dead_letters(args: argparse.Namespace) -> None:
    client = redis.Redis.from_url(args.redis_url, socket_connect_timeout=10, socket_timeout=30)
    try:
        if args.dead_command == "list":
            await list_dead_letters(client, args.queue, as_json=args.json)
        else:
            await requeue_dead_letters(client, args.queue, None if args.all else args.sha256)
    except redis.RedisError as exc:
        raise CommandError(f"cannot use Redis at {redact_url(args.redis_url)}: {exc}") from exc
    finally:
        await client.aclose()


async def list_dead_letters(client: Any, queue: str, *, as_json: bool = False, out: TextIO | None = None) -> int:
    """Print the dead letters of ``queue``, oldest first; how many there are."""
    out = out or sys.stdout
    lists = Lists(queue)
    letters = list(reversed(await client.lrange(lists.dead, 0, -1)))
    reasons = await client.hgetall(lists.reasons)
    for position, raw in enumerate(letters, 1):
        sha256 = hashlib.sha256(raw).hexdigest()
        reason = reasons.get(sha256.encode(), b"(no reason recorded)").decode()
        if as_json:
            print(orjson.dumps({"position": position, "sha256": sha256, "bytes": len(raw), "reason": reason,
                                "message": raw.decode("utf-8", "replace")}).decode(), file=out)
        else:
            print(f"#{position} sha256 {sha256[:16]}  {len(raw)} bytes  {reason}  {_preview(raw)}", file=out)
    if not as_json:
        print(f"{len(letters)} dead letter{'' if len(letters) == 1 else 's'} in {lists.dead}", file=out, flush=True)
    return len(letters)


async def requeue_dead_letters(client: Any, queue: str, sha256_prefix: str | None, *,
                               out: TextIO | None = None) -> int:
    """Move the dead letters of ``queue`` (those whose sha256 starts with ``sha256_prefix``; None:
    all) back onto the queue, oldest first, each atomically; how many moved."""
    out = out or sys.stdout
    lists = Lists(queue)
    moved = 0
    for raw in reversed(await client.lrange(lists.dead, 0, -1)):
        sha256 = hashlib.sha256(raw).hexdigest()
        if sha256_prefix is not None and not sha256.startswith(sha256_prefix.lower()):
            continue
        async with client.pipeline(transaction=True) as pipe:
            pipe.lrem(lists.dead, -1, raw)
            pipe.lpush(lists.queue, raw)
            pipe.hdel(lists.reasons, sha256)
            await pipe.execute()
        moved += 1
        print(f"requeued sha256 {sha256[:16]} onto {queue}", file=out, flush=True)
    print(f"{moved} dead letter{'' if moved == 1 else 's'} requeued onto {queue}", file=out, flush=True)
    return moved


async def _peek(client: Any, lists: Lists, chunk: int = 500) -> AsyncIterator[tuple[bytes, bool]]:
    """Dry run: the same messages in the same order, read without moving anything (negative
    indexes: producers pushing at the other end do not shift them)."""
    for name, recovering in ((lists.processing, True), (lists.queue, False)):
        start = 1
        while True:
            batch = await client.lrange(name, -(start + chunk - 1), -start)
            for raw in reversed(batch):
                yield raw, recovering
            if len(batch) < chunk:
                break
            start += chunk
