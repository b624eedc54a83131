"""``leasehold partitions …`` and ``leasehold retention run``: the event log's time partitions.

    leasehold partitions list
    leasehold partitions ensure [--span INTERVAL] [--ahead INTERVAL]
    leasehold retention run --older-than AGE --out DIR [--signing-key KEY] [--execute]

``partitions ensure`` creates partitions ahead of time (the Gateway does it too, every
``LEASEHOLD_PARTITION_INTERVAL_SECONDS``). ``retention run`` lists the partitions wholly older
than AGE (``90d``, ``12w``, ``36h``…) and what it would do; with ``--execute`` it archives each
into ``DIR/<partition>/`` (an audit bundle signed with the seal key), verifies the archive and
only then detaches and drops the partition, recording the archive's digest in the log's
register (``event_archives``). It needs the database owner's role (the application role may
not drop a partition). Exit codes: 0 done (or nothing due), 1 an archive failed (its partition
was kept), 2 a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson

from leasehold.cli.dburl import add_database_options, check_migrated, resolve_database_url
from leasehold.cli.main import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CommandError
from leasehold.persistence.connection import connect
from leasehold.persistence.partitions import ensure_partitions, list_partitions
from leasehold.persistence.seals import SealKeyError, load_private_key
from leasehold.replay.retention import ArchiveFailed, archive_partition, due_partitions

__all__ = ["register"]

_AGE = re.compile(r"^([0-9]+)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``leasehold partitions`` and ``leasehold retention``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON")
    add_database_options(common)

    partitions = subparsers.add_parser(
        "partitions", help="the event log's time partitions: list them, create them ahead",
        description="The event log is partitioned by recorded_at (see the docs: Audit, 'Partitions and retention').")
    actions = partitions.add_subparsers(dest="partitions_command", metavar="ACTION", required=True)
    p = actions.add_parser("list", parents=[common], help="every partition with its range and estimated rows")
    p.set_defaults(func=_list)
    p = actions.add_parser("ensure", parents=[common], help="create partitions until now() + AHEAD is covered")
    p.add_argument("--span", default="1 month", metavar="INTERVAL",
                   help="range of each new partition, a PostgreSQL interval (default: 1 month)")
    p.add_argument("--ahead", default="2 months", metavar="INTERVAL",
                   help="how far ahead of now the partitions must reach (default: 2 months)")
    p.set_defaults(func=_ensure)

    retention = subparsers.add_parser(
        "retention", help="archive old partitions of the event log as signed bundles, then drop them",
        description="Archive each partition wholly older than --older-than as a signed audit bundle, verify it,"
                    " then detach and drop the partition (see the docs: Audit, 'Partitions and retention').")
    actions = retention.add_subparsers(dest="retention_command", metavar="ACTION", required=True)
    p = actions.add_parser("run", parents=[common], help="archive and drop the partitions older than AGE")
    p.add_argument("--older-than", required=True, type=_age, metavar="AGE",
                   help="retention: a partition whose range ends before now minus AGE is due (90d, 12w, 36h)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="archives are written to DIR/<partition>/ (each must be new or empty)")
    p.add_argument("--signing-key", type=Path, metavar="KEY",
                   help="seal private key that signs each archive (default: $LEASEHOLD_SEAL_KEY_FILE)")
    p.add_argument("--execute", action="store_true",
                   help="archive and drop; without it, only say which partitions are due (a dry run)")
    p.set_defaults(func=_run)


def _age(text: str) -> timedelta:
    match = _AGE.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number and a unit, e.g. 90d, 12w, 36h, 30m, 45s")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def _url(args: argparse.Namespace) -> str:
    url = resolve_database_url(args.database_url, embedded=args.embedded)
    check_migrated(url)
    return url


def _print(args: argparse.Namespace, data: Any, *lines: str) -> None:
    if args.json:
        print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
    else:
        for line in lines:
            print(line)


def _iso(value: Any) -> str | None:
    return None if value is None else str(value.isoformat())


def _list(args: argparse.Namespace) -> int:
    async def go() -> list[Any]:
        async with await connect(_url(args), application_name="leasehold-partitions") as conn:
            return await list_partitions(conn)

    found = asyncio.run(go())
    _print(args, [{"name": p.name, "lower_bound": _iso(p.lower_bound), "upper_bound": _iso(p.upper_bound),
                   "default": p.is_default, "estimated_rows": p.estimated_rows} for p in found],
           *(f"{p.name}  {_range(p)}  ~{p.estimated_rows} rows" for p in found))
    return EXIT_OK


def _range(p: Any) -> str:
    return "default" if p.is_default else f"{_iso(p.lower_bound) or '-inf'} .. {_iso(p.upper_bound)}"


def _ensure(args: argparse.Namespace) -> int:
    async def go() -> list[str]:
        async with await connect(_url(args), application_name="leasehold-partitions") as conn:
            return await ensure_partitions(conn, span=args.span, ahead=args.ahead)

    try:
        created = asyncio.run(go())
    except Exception as exc:
        if type(exc).__module__.startswith("psycopg"):
            raise CommandError(f"cannot create partitions: {exc}", EXIT_USAGE) from exc
        raise
    _print(args, {"created": created}, f"created {len(created)} partitions" + (": " + ", ".join(created)
                                                                               if created else " (coverage is enough)"))
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    key = None
    if args.execute:
        key_path = args.signing_key or (Path(os.environ["LEASEHOLD_SEAL_KEY_FILE"])
                                        if os.environ.get("LEASEHOLD_SEAL_KEY_FILE") else None)
        if key_path is None:
            raise CommandError("give --signing-key or set $LEASEHOLD_SEAL_KEY_FILE: archives are signed", EXIT_USAGE)
        try:
            key = load_private_key(key_path)
        except SealKeyError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
    url = _url(args)

    async def go() -> tuple[list[dict[str, Any]], bool]:
        out: list[dict[str, Any]] = []
        failed = False
        async with await connect(url, application_name="leasehold-retention") as conn:
            for partition in await due_partitions(conn, args.older_than):
                entry: dict[str, Any] = {"partition": partition.name, "lower_bound": _iso(partition.lower_bound),
                                         "upper_bound": _iso(partition.upper_bound),
                                         "directory": str(args.out / partition.name)}
                out.append(entry)
                if key is None:
                    entry["action"] = "would archive"
                    continue
                try:
                    done = await archive_partition(conn, partition, args.out / partition.name, key)
                except (ArchiveFailed, FileExistsError) as exc:
                    entry.update(action="kept", error=str(exc))
                    failed = True
                    break
                entry.update(action="archived", events=done.record.events, streams=done.record.streams,
                             manifest_sha256=done.record.manifest_sha256, key_id=done.record.key_id,
                             seconds=round(done.seconds, 3))
        return out, failed

    entries, failed = asyncio.run(go())
    lines = [f"{e['action']} {e['partition']} ({e['lower_bound'] or '-inf'} .. {e['upper_bound']})"
             + (f": {e['events']} events of {e['streams']} streams to {e['directory']}, manifest sha256"
                f" {e['manifest_sha256']}" if e["action"] == "archived" else "")
             + (f": {e['error']}" if "error" in e else "") for e in entries]
    if not entries:
        lines.append("no partition is older than the retention")
    elif key is None:
        lines.append("dry run: nothing archived or dropped (add --execute)")
    _print(args, {"dry_run": key is None, "partitions": entries}, *lines)
    return EXIT_FAILURE if failed else EXIT_OK
