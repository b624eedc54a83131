"""``leasehold legacy drain``: move the legacy Redis scan queue's messages into Gateway scans.

The legacy API pushed one message per scan onto a Redis list (``LPUSH``) and the legacy worker
took them from the other end (``BRPOP``). The drain reads them in the same order and, for each
(message format: :mod:`domain.legacy`; decisions: :mod:`gateway.commands.legacy`):

1. moves it atomically to ``<queue>:processing`` (``LMOVE queue processing RIGHT LEFT``), so a
   crash never loses it;
2. converts it in one database transaction: a Gateway scan keyed on the legacy scan id (unique
   among Gateway scans), its first step's task included;
3. after the commit, removes it from ``<queue>:processing`` — or moves it (``LPUSH`` + ``LREM``
   in one ``MULTI``) to ``<queue>:refused`` when the scan already started in either mode, or to
   ``<queue>:invalid`` when the message cannot be converted (not JSON, a missing field, an
   unknown organisation or profile…). Nothing is dropped; every decision is printed.

On start it first re-handles what a previous run left in ``<queue>:processing``: a message
whose scan that run already committed is recognised (same legacy id and message sha256) and
only removed. So running it twice, or after a crash between the commit and the removal, creates
each scan once. ``--dry-run`` reads both lists without changing them and rolls every
transaction back. Exit status: 0 when the queue is drained (refused and invalid messages
included), 1 when Redis or PostgreSQL cannot be reached (what is left stays in the lists), 2 for a
usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TextIO
from uuid import UUID

import redis.asyncio as redis
from psycopg import AsyncConnection, OperationalError
from psycopg_pool import PoolTimeout

from leasehold.cli.dburl import add_database_options, resolve_database_url
from leasehold.cli.embedded import redact_url
from leasehold.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from leasehold.domain.errors import Conflict, LeaseholdError, Unavailable
from leasehold.domain.legacy import InvalidMessage, parse_message
from leasehold.gateway.commands.legacy import Conversion, LegacyScans
from leasehold.gateway.services import build_services
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database

__all__ = ["drain", "register"]

PROGRESS_EVERY = 100
_LABELS = {"converted": "converted", "already_converted": "already converted", "refused": "refused",
           "invalid": "invalid"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``legacy`` command group (``drain``) to the ``leasehold`` CLI."""
    legacy = subparsers.add_parser("legacy", help="the legacy Redis scan queue (moving it to the Gateway)",
                                   description="Tools for the migration from the legacy Redis scan queue.")
    commands = legacy.add_subparsers(dest="legacy_command", metavar="COMMAND", required=True)
    drain_parser = commands.add_parser(
        "drain", help="move queued legacy scan messages into Gateway scans",
        description="Move the messages of the legacy scan queue (a Redis list: producers LPUSH, the "
                    "consumer pops from the right) into Gateway scans, idempotently. Messages whose "
                    "scan already started go to QUEUE:refused, unusable ones to QUEUE:invalid; "
                    "QUEUE:processing holds the message being handled.")
    drain_parser.add_argument("--redis-url", required=True, metavar="URL", help="redis:// URL of the legacy queue")
    drain_parser.add_argument("--queue", required=True, metavar="NAME", help="the Redis list the legacy API pushes to")
    add_database_options(drain_parser)
    drain_parser.add_argument("--dry-run", action="store_true",
                              help="report what would happen; change nothing in Redis or PostgreSQL")
    drain_parser.add_argument("--limit", type=int, metavar="N", help="handle at most N messages, then stop")
    drain_parser.set_defaults(func=_drain_command)


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
        try:
            message = parse_message(raw)
        except InvalidMessage as exc:
            outcome, text = "invalid", f"message {_preview(raw)}: {exc.message}"
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
            except (Unavailable, Conflict) as exc:  # the database is gone, or a race to try again
                raise CommandError(f"{exc.message} (legacy scan {message.legacy_scan_id} stays in "
                                   f"{lists.processing}; run the drain again)") from exc
            except LeaseholdError as exc:  # an unknown organisation or profile, steps a rule refuses…
                outcome, text = "invalid", f"legacy scan {message.legacy_scan_id}: {_explain(exc)}"
        target = {"refused": lists.refused, "invalid": lists.invalid}.get(outcome)
        if not dry_run:
            await _acknowledge(client, lists, raw, target)
        counts[outcome] += 1
        moved = f" -> {verb}moved to {target}" if target else ""
        print(f"#{number} {verb}{_LABELS[outcome]}: {text}{moved}", file=out, flush=True)
        if number % PROGRESS_EVERY == 0:
            print(f"{number} messages so far: {_summary(counts)}", file=err, flush=True)
    total = sum(counts.values())
    prefix = "dry run, nothing changed" if dry_run else "done"
    print(f"{prefix}: {total} message{'' if total == 1 else 's'} from {queue}: {_summary(counts)}"
          + (f"; see {lists.refused}" if counts["refused"] else "")
          + (f"; see {lists.invalid}" if counts["invalid"] else ""), file=out, flush=True)
    return counts


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


async def _acknowledge(client: Any, lists: Lists, raw: bytes, target: str | None) -> None:
    """The message is dealt with (its transaction committed): off the processing list, onto
    ``target`` if any, atomically."""
    async with client.pipeline(transaction=True) as pipe:
        if target is not None:
            pipe.lpush(target, raw)
        pipe.lrem(lists.processing, -1, raw)
        await pipe.execute()


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
