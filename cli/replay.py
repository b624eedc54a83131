"""``leasehold replay …``: the auditor's command line.

    leasehold replay timeline (TASK_ID | --scan SCAN_ID) [--archive PATH ...]
    leasehold replay rebuild --schema NAME [--replace] [--jobs N]
    leasehold replay verify [--schema NAME] [--jobs N] [--since CHECKPOINT|SEAL|TIME]
    leasehold replay as-of TIME (TASK_ID | --scan SCAN_ID) [--clock event|recorded]
    leasehold replay verify-chain [--digests PATH] [--public-key KEY] [--archive PATH ...]
    leasehold replay verify-fair-shares
    leasehold replay checkpoint
    leasehold replay export (TASK_ID | --scan SCAN_ID) OUT [--signing-key KEY]
    leasehold replay verify-bundle OUT [--public-key KEY]

Every action but ``verify-bundle`` works on the database of ``--database-url``, else
``$LEASEHOLD_DATABASE_URL``, else ``$DATABASE_URL`` (``--embedded``: the embedded development
server; nothing set: a usage error), named on stderr, and refuses one that was never migrated.
``verify``, ``verify-chain`` and ``verify-fair-shares`` of a log without events say ``EMPTY`` and exit 1: nothing was
verified. Every action takes ``--json`` (machine output) and ``--no-progress``. Exit codes: 0 all
good, 1 a finding (differences, broken chains, a bad bundle, nothing to verify) or a failure, 2
a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from leasehold.cli.arguments import iso_time
from leasehold.cli.dburl import add_database_options, resolve_database_url
from leasehold.cli.main import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CommandError
from leasehold.persistence.checkpoints import Checkpoint, find_checkpoint, write_checkpoint
from leasehold.persistence.codec import DecodeError
from leasehold.persistence.connection import connect
from leasehold.persistence.partitions import archive_records
from leasehold.persistence.queries import QUERIES
from leasehold.persistence.seals import SealKeyError, load_private_key, load_public_key
from leasehold.persistence.snapshot import snapshot
from leasehold.persistence.tables import fair_share_rows
from leasehold.persistence.urls import database_label
from leasehold.projections.memory import ProjectionError
from leasehold.replay import render
from leasehold.replay.admission import admission_decisions
from leasehold.replay.archive import ArchiveSet, verify_bundle_or_archive
from leasehold.replay.asof import scan_as_of, task_as_of
from leasehold.replay.bundle import export_bundle
from leasehold.replay.digests import load_digests
from leasehold.replay.fairness import fair_share_differences
from leasehold.replay.integrity import verify_log
from leasehold.replay.log import NotFound
from leasehold.replay.parallel import EVENTS_PER_JOB, default_jobs
from leasehold.replay.rebuild import RebuildError, check_schema_name, rebuild_schema
from leasehold.replay.timeline import scan_timeline, task_timeline
from leasehold.replay.verify import verify_projections

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``leasehold replay`` and its actions."""
    replay = subparsers.add_parser(
        "replay", help="audit the event log: timelines, rebuild, verify, as-of, checkpoints, export",
        description="Audit tools over the event log. Reads run in one REPEATABLE READ snapshot, so they are "
                    "safe while the Gateway is running.")
    actions = replay.add_subparsers(dest="replay_command", metavar="ACTION", required=True)
    offline = argparse.ArgumentParser(add_help=False)
    offline.add_argument("--json", action="store_true", help="print JSON instead of tables")
    offline.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    common = argparse.ArgumentParser(add_help=False, parents=[offline])
    add_database_options(common)

    def jobs(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--jobs", type=_positive, metavar="N",
                            help=f"processes folding the log (default: the number of cores, fewer for a"
                                 f" log under {EVENTS_PER_JOB:,} events a process)")

    def subject(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("task_id", nargs="?", type=_uuid, metavar="TASK_ID")
        parser.add_argument("--scan", type=_uuid, metavar="SCAN_ID", help="a scan and all its tasks instead")

    def archives(parser: argparse.ArgumentParser, what: str) -> None:
        parser.add_argument("--archive", type=_archive_dir, action="append", default=[], metavar="PATH",
                            help=f"an archived partition (from `leasehold retention run`) {what}; repeatable")

    p = actions.add_parser("timeline", parents=[common], help="every event of a task or scan, in order")
    subject(p)
    archives(p, "whose events come before the live log's")
    p.set_defaults(func=_run(_timeline))

    p = actions.add_parser("rebuild", parents=[common], help="rebuild every projection into a fresh schema")
    p.add_argument("--schema", required=True, metavar="NAME", help="schema to create (never public)")
    p.add_argument("--replace", action="store_true", help="drop and recreate NAME if an earlier rebuild made it")
    jobs(p)
    p.set_defaults(func=_run(_rebuild))

    p = actions.add_parser("verify", parents=[common],
                           help="rebuild in memory and diff against the live projections (exit 1 on any difference)")
    p.add_argument("--schema", default="public", metavar="NAME",
                   help="compare the projections in this schema (default: public, the live ones)")
    jobs(p)
    p.add_argument("--since", type=_since, metavar="CHECKPOINT|SEAL|TIME",
                   help="verify only what the log changed from a checkpoint on: its id, its seal (hex), or a time"
                        " (the latest checkpoint made at or before it); default: everything")
    p.set_defaults(func=_run(_verify))

    p = actions.add_parser("as-of", parents=[common], help="a task or scan as it was at TIME")
    p.add_argument("time", type=iso_time, metavar="TIME", help="ISO 8601; without an offset it is UTC")
    subject(p)
    p.add_argument("--clock", choices=("event", "recorded"), default="event",
                   help="event: the events' own time (default, hash-covered); recorded: the recorded_at column")
    p.set_defaults(func=_run(_as_of))

    p = actions.add_parser("verify-chain", parents=[common],
                           help="walk every hash chain and check the checkpoints (exit 1 on any break)")
    p.add_argument("--digests", type=Path, metavar="PATH",
                   help="also hold the log against the signed seals in this digest directory (needs --public-key)")
    p.add_argument("--public-key", type=Path, metavar="KEY",
                   help="the seal public key (PEM, from `leasehold seal keygen`) the digests and the archives'"
                        " signatures are checked with")
    archives(p, "to verify and to continue the chains from")
    p.set_defaults(func=_run(_verify_chain))

    p = actions.add_parser("verify-fair-shares", parents=[common],
                           help="re-derive every organisation's fair-share state from the log and compare it with"
                                " org_service (exit 1 on any difference)")
    p.set_defaults(func=_run(_verify_fair_shares))

    p = actions.add_parser("verify-admission", parents=[common],
                           help="re-derive every admission decision from the log: each task and scan created"
                                " within its organisation's caps then (exit 1 on any created past one)")
    p.set_defaults(func=_run(_verify_admission))

    p = actions.add_parser("checkpoint", parents=[common], help="seal the current heads of all streams")
    p.set_defaults(func=_run(_checkpoint))

    p = actions.add_parser("export", parents=[common], help="write an audit bundle of a task or scan to OUT")
    p.add_argument("task_id", nargs="?", type=_uuid, metavar="TASK_ID")
    p.add_argument("out", type=Path, metavar="OUT", help="directory to create (must be new or empty)")
    p.add_argument("--scan", type=_uuid, metavar="SCAN_ID", help="a scan and all its tasks instead")
    p.add_argument("--signing-key", type=Path, metavar="KEY",
                   help="sign manifest.json with this seal private key (PEM); writes manifest.sig")
    p.set_defaults(func=_run(_export))

    p = actions.add_parser("verify-bundle", parents=[offline],
                           help="verify an audit bundle offline (no database; exit 1 on any mismatch)")
    p.add_argument("out", type=Path, metavar="OUT")
    p.add_argument("--public-key", type=Path, metavar="KEY",
                   help="require manifest.sig to be a valid signature of manifest.json under this public key")
    p.set_defaults(func=_verify_bundle)


# --- argument types and plumbing -------------------------------------------------------------


def _uuid(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a UUID: {text!r}") from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


_SEAL = re.compile(r"^[0-9a-f]{64}$")


def _archive_dir(text: str) -> Path:
    path = Path(text)
    if not (path / "manifest.json").is_file():
        raise argparse.ArgumentTypeError(f"{text}: not an archive directory (no manifest.json)")
    return path


def _since(text: str) -> int | bytes | datetime:
    """A checkpoint id, a seal (64 hex digits) or an ISO 8601 time."""
    if text.isdigit():
        return int(text)
    if _SEAL.match(text.lower()):
        return bytes.fromhex(text)
    try:
        return iso_time(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"not a checkpoint id, seal or ISO 8601 time: {text!r}") from None


def _subject(args: argparse.Namespace) -> tuple[UUID, str]:
    if (args.task_id is None) == (args.scan is None):
        raise CommandError("give exactly one of TASK_ID or --scan SCAN_ID", EXIT_USAGE)
    return (args.scan, "scan") if args.scan is not None else (args.task_id, "task")


def _url(args: argparse.Namespace) -> str:
    """The database of this run, resolved (and named on stderr) once however often asked."""
    if getattr(args, "_url", None) is None:
        args._url = resolve_database_url(args.database_url, embedded=args.embedded)
    url: str = args._url
    return url


def _run(handler: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(handler(args))
        except NotFound as exc:
            raise CommandError(str(exc)) from exc
        except (DecodeError, ProjectionError) as exc:
            raise CommandError(f"{exc} (run: leasehold replay verify-chain)") from exc
        except RebuildError as exc:
            raise CommandError(str(exc), EXIT_USAGE if "must match" in str(exc) or "refusing to rebuild into"
                               in str(exc) else EXIT_FAILURE) from exc
        except FileExistsError as exc:
            raise CommandError(str(exc)) from exc

    return run


async def _connect(args: argparse.Namespace) -> Any:
    """A connection to the audited database, which must be a migrated leasehold database."""
    conn = await connect(_url(args), application_name="leasehold-replay")
    try:
        cur = await conn.execute(QUERIES["schema_migrated"])
        row = await cur.fetchone()
    except BaseException:
        await conn.close()
        raise
    if not (row and row[0]):
        await conn.close()
        raise CommandError(f"{database_label(args._url)} is not a leasehold database (never migrated): "
                           "nothing to audit; check --database-url / LEASEHOLD_DATABASE_URL")
    return conn


async def _note_archived(conn: Any, action: str) -> None:
    """Say on stderr when partitions of the log were archived: ``action`` reads the live log only."""
    records = await archive_records(conn)
    await conn.rollback()
    if records:
        print(f"leasehold: note: {_n(len(records), 'partition')} of the log"
              f" {'was' if len(records) == 1 else 'were'} archived (up to"
              f" {records[-1].upper_bound.isoformat()}); {action} reads the live log only, so streams whose"
              " early events were archived are not covered (verify-chain and timeline take --archive)",
              file=sys.stderr)


async def _estimated_events(conn: Any) -> int | None:
    """The planner's estimate of the log size (instant), for the progress bar's total."""
    cur = await conn.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = 'events'::regclass")
    row = await cur.fetchone()
    await conn.rollback()
    return int(row[0]) if row and row[0] > 0 else None


def _n(count: int, noun: str) -> str:
    """``1 problem``, ``2 problems``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _out(*lines: str) -> None:
    for line in lines:
        print(line)


# --- actions ---------------------------------------------------------------------------------


async def _timeline(args: argparse.Namespace) -> int:
    subject, kind = _subject(args)
    async with await _connect(args) as conn, snapshot(conn):
        entries = await (scan_timeline if kind == "scan" else task_timeline)(conn, subject, archives=args.archive)
    if args.json:
        render.print_json({"subject": {"kind": kind, "id": str(subject)}, "events": [e.as_json() for e in entries]})
    else:
        c = render.console()
        c.print(render.timeline_table(entries, merged=kind == "scan"))
        rejected = sum(e.rejected for e in entries)
        c.print(f"{_n(len(entries), 'event')}, {_n(rejected, 'rejected write')}")
    return EXIT_OK


async def _rebuild(args: argparse.Namespace) -> int:
    check_schema_name(args.schema)
    async with await _connect(args) as source, await _connect(args) as target:
        await _note_archived(source, "rebuild")
        total = await _estimated_events(source)
        with render.progress_bar("rebuild", total, not args.no_progress) as update:
            result = await rebuild_schema(source, target, args.schema, replace=args.replace, progress=update,
                                          jobs=args.jobs or default_jobs(total), url=_url(args))
    seconds = result.fold_seconds + result.load_seconds
    rate = result.events / seconds if seconds else 0.0
    if args.json:
        render.print_json({"schema": result.schema, "events": result.events, "rows": result.rows,
                           "fold_seconds": round(result.fold_seconds, 3),
                           "load_seconds": round(result.load_seconds, 3), "events_per_second": round(rate),
                           "snapshot_time": result.snapshot_time.isoformat() if result.snapshot_time else None})
    else:
        _out(f"rebuilt {result.events} events into schema {result.schema} in {seconds:.2f}s"
             f" (fold {result.fold_seconds:.2f}s, load {result.load_seconds:.2f}s, {rate:,.0f} events/s)",
             *(f"  {table}: {count} rows" for table, count in result.rows.items()))
    return EXIT_OK


async def _verify(args: argparse.Namespace) -> int:
    async with await _connect(args) as conn:
        await _note_archived(conn, "verify")
        since = None
        if args.since is not None:
            since = await _checkpoint_of(conn, args.since)
            total = None
        else:
            total = await _estimated_events(conn)
        with render.progress_bar("verify", total, not args.no_progress) as update:
            result = await verify_projections(conn, schema=args.schema, progress=update, since=since,
                                              jobs=args.jobs or default_jobs(total), url=_url(args))
    # An empty log verifies nothing: never "OK" (from a checkpoint on, nothing new is fine).
    empty = result.events == 0 and result.since is None
    ok = result.ok and not empty
    if args.json:
        render.print_json({
            "ok": ok, "empty": empty, "events": result.events, "rows": result.rows,
            "seconds": round(result.seconds, 3),
            "since": _checkpoint_json(result.since), "latest_checkpoint": _checkpoint_json(result.latest),
            "differences": [{"table": d.table, "key": [str(k) for k in d.key], "kind": d.kind,
                             "columns": {c: [render._jsonable(a), render._jsonable(b)]
                                         for c, (a, b) in d.columns.items()}}
                            for d in result.differences]})
    else:
        _out(*(str(d) for d in result.differences))
        rows = sum(result.rows.values())
        verdict = ("OK" if ok else "EMPTY" if result.ok else _n(len(result.differences), "difference").upper())
        scope = "" if result.since is None else f" (since checkpoint {result.since.id})"
        _out(f"{verdict}: {result.events} events rebuilt and compared with {rows} live rows{scope}"
             f" in {result.seconds:.2f}s" + (" (the log holds no events: nothing was verified)"
                                            if empty else ""))
        if result.latest is not None:
            _out(f"verified through checkpoint {result.latest.id} (next: --since {result.latest.seal.hex()})")
    return EXIT_OK if ok else EXIT_FAILURE


async def _verify_fair_shares(args: argparse.Namespace) -> int:
    """``org_service`` (the acquire's fair-share state, written under each organisation's row
    lock, not a projection) against what the lease events recorded: one snapshot, the live log."""
    async with await _connect(args) as conn:
        await _note_archived(conn, "verify-fair-shares")
        differences = await fair_share_differences(conn)
        organizations = len(await fair_share_rows(conn))
        await conn.rollback()
    empty = not organizations and not differences
    ok = not differences and not empty
    if args.json:
        render.print_json({"ok": ok, "empty": empty, "organizations": organizations, "differences": differences})
    else:
        _out(*differences)
        verdict = "OK" if ok else "EMPTY" if not differences else _n(len(differences), "difference").upper()
        _out(f"{verdict}: the fair-share state of {_n(organizations, 'organisation')} compared with the log")
    return EXIT_OK if ok else EXIT_FAILURE


async def _verify_admission(args: argparse.Namespace) -> int:
    """Every creation the admission caps govern, re-derived from the log (one snapshot): the caps
    in force and what was queued just before it (:mod:`replay.admission`)."""
    async with await _connect(args) as conn:
        await _note_archived(conn, "verify-admission")
        decisions = await admission_decisions(conn)
        await conn.rollback()
    past = [d for d in decisions if not d.within_cap]
    capped = sum(d.cap is not None for d in decisions)
    lines = [f"{d.kind} {d.created_id} of organisation {d.organization_id} created with {d.queued_before} queued,"
             f" past its cap of {d.cap}" for d in past]
    if args.json:
        render.print_json({"ok": not past, "creations": len(decisions), "capped": capped, "past_cap": lines})
    else:
        _out(*lines)
        verdict = "OK" if not past else _n(len(past), "creation").upper() + " PAST A CAP"
        _out(f"{verdict}: {_n(len(decisions), 'creation')} re-derived, {capped} under a cap")
    return EXIT_OK if not past else EXIT_FAILURE


async def _checkpoint_of(conn: Any, since: int | bytes | datetime) -> Checkpoint:
    if isinstance(since, int):
        found = await find_checkpoint(conn, id=since)
    elif isinstance(since, bytes):
        found = await find_checkpoint(conn, seal=since)
    else:
        found = await find_checkpoint(conn, at_or_before=since)
    await conn.rollback()
    if found is None:
        raise CommandError(f"no checkpoint matches --since {_since_text(since)} (run: leasehold replay checkpoint)")
    return found


def _since_text(since: int | bytes | datetime) -> str:
    return since.hex() if isinstance(since, bytes) else since.isoformat() if isinstance(since, datetime) else str(since)


def _checkpoint_json(cp: Checkpoint | None) -> dict[str, Any] | None:
    return None if cp is None else {"id": cp.id, "created_at": cp.created_at.isoformat(), "seal": cp.seal.hex()}


async def _as_of(args: argparse.Namespace) -> int:
    subject, kind = _subject(args)
    async with await _connect(args) as conn, snapshot(conn):
        if kind == "task":
            task = await task_as_of(conn, subject, args.time, clock=args.clock)
        else:
            scan = await scan_as_of(conn, subject, args.time, clock=args.clock)
    c = render.console()
    if kind == "task":
        if args.json:
            render.print_json(render.task_as_of_json(task))
        else:
            c.print(render.task_as_of_table(task))
    elif args.json:
        render.print_json(render.scan_as_of_json(scan))
    else:
        for table in render.scan_as_of_tables(scan):
            c.print(table)
    return EXIT_OK


def _public_key(path: Path) -> Any:
    try:
        return load_public_key(path)
    except SealKeyError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc


async def _verify_chain(args: argparse.Namespace) -> int:
    if (args.digests is not None and args.public_key is None) or (
            args.public_key is not None and args.digests is None and not args.archive):
        raise CommandError("--digests needs --public-key (which checks the digests and the archives)", EXIT_USAGE)
    digests = None
    public_key = _public_key(args.public_key) if args.public_key is not None else None
    if args.digests is not None and public_key is not None:
        if not args.digests.is_dir():
            raise CommandError(f"{args.digests}: not a digest directory", EXIT_USAGE)
        digests = load_digests(args.digests, public_key)
    archives = ArchiveSet.load(args.archive, public_key=public_key) if args.archive else None
    async with await _connect(args) as conn:
        total = await _estimated_events(conn)
        with render.progress_bar("verify-chain", total, not args.no_progress) as update:
            report = await verify_log(conn, progress=update, digests=digests, archives=archives)
    latest = report.latest
    ok = report.ok and report.events > 0  # an empty log verifies nothing: never "OK"
    newest = digests.newest if digests is not None else None
    digest_json = None if digests is None else {
        "records": digests.records,
        "newest": None if newest is None else {k: newest[k] for k in (
            "checkpoint_id", "created_at", "position", "head_count", "event_count", "seal")},
        "unsealed": report.unsealed.as_json() if report.unsealed else None}
    if args.json:
        render.print_json({
            "digests": digest_json,
            "ok": ok, "empty": report.events == 0, "streams": report.streams, "events": report.events,
            "archives": len(args.archive), "archived_events": report.archived_events,
            "checkpoints": len(report.checkpoints), "seconds": round(report.seconds, 3),
            "latest_checkpoint": None if latest is None else {
                "id": latest.id, "created_at": latest.created_at.isoformat(), "seal": latest.seal.hex(),
                "head_count": latest.head_count, "event_count": latest.event_count},
            "problems": [{"source": p.source, "stream": str(p.originator_id) if p.originator_id else None,
                          "version": p.version, "checkpoint_id": p.checkpoint_id, "problem": p.message}
                         for p in report.problems]})
    else:
        _out(*(str(p) for p in report.problems))
        sealed = (f"; latest checkpoint {latest.id} at {latest.created_at.isoformat()} seals {latest.head_count}"
                  f" streams, seal {latest.seal.hex()}" if latest else "; no checkpoint yet (run: replay checkpoint)")
        verdict = "OK" if ok else "EMPTY" if report.ok else _n(len(report.problems), "problem").upper()
        archived = (f" (and {_n(report.archived_events, 'archived event')} in {_n(len(args.archive), 'archive')})"
                    if args.archive else "")
        _out(f"{verdict}: {_n(report.streams, 'stream')}, {_n(report.events, 'event')}{archived},"
             f" {_n(len(report.checkpoints), 'checkpoint')}"
             f" checked in {report.seconds:.2f}s{sealed}"
             + (" (the log holds no events: nothing was verified)" if report.events == 0 else ""))
        if digests is not None:
            _out(_digest_summary(digests.records, newest, report.unsealed))
    return EXIT_OK if ok else EXIT_FAILURE


def _digest_summary(records: int, newest: dict[str, Any] | None, unsealed: Any) -> str:
    if newest is None:
        return f"digests: {_n(records, 'valid record')}; nothing sealed yet, every event is unsealed" + (
            f" ({_n(unsealed.events, 'event')})" if unsealed else "")
    window = (f"{_n(unsealed.events, 'event')} in {_n(unsealed.streams, 'stream')}"
              f" ({unsealed.new_streams} new) written after it, {unsealed.seconds_since_newest_digest:.1f}s ago"
              if unsealed and unsealed.seconds_since_newest_digest is not None else "unknown")
    return (f"digests: {_n(records, 'signed record')}, newest checkpoint {newest['checkpoint_id']} at"
            f" {newest['created_at']} seals {newest['head_count']} streams/{newest['event_count']} events;"
            f" unsealed window: {window}")


async def _checkpoint(args: argparse.Namespace) -> int:
    async with await _connect(args) as conn:
        cp = await write_checkpoint(conn)
    if args.json:
        render.print_json({"id": cp.id, "created_at": cp.created_at.isoformat(), "head_count": cp.head_count,
                           "changed_count": cp.changed_count, "event_count": cp.event_count,
                           "prev_seal": cp.prev_seal.hex(), "seal": cp.seal.hex()})
    else:
        _out(f"checkpoint {cp.id} at {cp.created_at.isoformat()}: {cp.head_count} streams, {cp.event_count} events"
             f" ({cp.changed_count} heads changed)",
             f"seal {cp.seal.hex()}",
             "keep a copy of this seal off this machine: it is the evidence against a rewrite of the database")
    return EXIT_OK


async def _export(args: argparse.Namespace) -> int:
    subject, kind = _subject(args)
    async with await _connect(args) as conn, snapshot(conn):
        key = None
        if args.signing_key is not None:
            try:
                key = load_private_key(args.signing_key)
            except SealKeyError as exc:
                raise CommandError(str(exc), EXIT_USAGE) from exc
        result = await export_bundle(conn, subject, kind, args.out, signing_key=key)
    if args.json:
        render.print_json({"directory": str(result.directory), "streams": result.streams, "events": result.events,
                           "batches": result.batches, "manifest_sha256": result.manifest_sha256,
                           "chain_problems": result.chain_problems})
    else:
        _out(f"exported {result.events} events of {result.streams} streams and {result.batches} batches"
             f" to {result.directory}", f"manifest.json sha256 {result.manifest_sha256}",
             *(f"WARNING: {p}" for p in result.chain_problems))
    return EXIT_FAILURE if result.chain_problems else EXIT_OK


def _verify_bundle(args: argparse.Namespace) -> int:
    public_key = _public_key(args.public_key) if args.public_key is not None else None
    summary, problems = verify_bundle_or_archive(args.out, public_key=public_key)
    if args.json:
        render.print_json({"ok": not problems, **summary, "problems": problems})
    else:
        _out(*problems)
        verdict = "OK" if not problems else _n(len(problems), "problem").upper()
        _out(f"{verdict}: {_n(summary.get('events', 0), 'event')} in {_n(summary.get('streams', 0), 'stream')},"
             f" {_n(summary.get('batches', 0), 'batch')}".replace("batchs", "batches"))
    return EXIT_OK if not problems else EXIT_FAILURE
