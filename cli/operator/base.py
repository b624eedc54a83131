"""What every operator-API command shares: the connection options, the API key, running one
client session, printing items (text or ``--json``), and following list cursors."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from leasehold.cli.main import EXIT_OK, EXIT_USAGE, CommandError

T = TypeVar("T")
DEFAULT_URL = "https://localhost:8444"
Subparsers = argparse._SubParsersAction


def iso_time(value: str) -> datetime:
    """An ISO 8601 time with its offset (argparse type)."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {value!r}") from exc
    if parsed.tzinfo is None:
        raise argparse.ArgumentTypeError(f"give the time with its offset (e.g. {value}Z or {value}+00:00)")
    return parsed


def json_value(value: str) -> Any:
    """A JSON document given inline, or ``@FILE`` to read it from a file (argparse type)."""
    text = value
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text()
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot read {value[1:]}: {exc.strerror}") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc


def json_object(value: str) -> dict[str, Any]:
    parsed = json_value(value)
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return parsed


def json_list(value: str) -> list[Any]:
    parsed = json_value(value)
    if not isinstance(parsed, list):
        raise argparse.ArgumentTypeError("must be a JSON array")
    return parsed


def connection(parser: argparse.ArgumentParser) -> None:
    """The options that say which Gateway, with which key, and how to print."""
    group = parser.add_argument_group("connection")
    group.add_argument("--url", metavar="URL",
                       help=f"the Gateway's operator API (default: env LEASEHOLD_OPERATOR_URL, else {DEFAULT_URL})")
    group.add_argument("--api-key-file", type=Path, metavar="FILE",
                       help="file holding the operator API key (default: env LEASEHOLD_API_KEY)")
    group.add_argument("--ca-file", metavar="FILE",
                       help="CA certificate of the Gateway's TLS certificate (default: env LEASEHOLD_CA_FILE, "
                            "else the system trust store)")
    group.add_argument("--json", action="store_true", help="print JSON (one object per line) instead of text")


def command(commands: Subparsers, name: str, help: str, description: str,
            func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """A subcommand with the connection options; its arguments are added by the caller."""
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help, description=description)
    parser.set_defaults(func=func)
    return parser


def page_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--organization", metavar="ORG_ID", help="only this organisation (administrator keys)")
    parser.add_argument("--created-from", type=iso_time, metavar="TIME",
                        help="only items created at or after TIME (ISO 8601 with offset)")
    parser.add_argument("--created-to", type=iso_time, metavar="TIME",
                        help="only items created before TIME (ISO 8601 with offset)")
    parser.add_argument("--limit", type=int, default=50, metavar="N", help="items per page, 1..500 (default 50)")
    parser.add_argument("--cursor", metavar="CURSOR", help="the next page's cursor, as a previous list printed it")
    parser.add_argument("--all", action="store_true", help="follow the cursors: every matching item")


def api_key(args: argparse.Namespace) -> str:
    if args.api_key_file is not None:
        try:
            key = args.api_key_file.read_text().strip()
        except OSError as exc:
            raise CommandError(f"cannot read --api-key-file: {exc.strerror}: {args.api_key_file}") from exc
    else:
        key = os.environ.get("LEASEHOLD_API_KEY", "").strip()
    if not key:
        raise CommandError("no API key: set LEASEHOLD_API_KEY or pass --api-key-file FILE", EXIT_USAGE)
    return key


def run(args: argparse.Namespace, body: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``body(client)`` against the operator API; API and connection errors as one line."""
    import aiohttp

    from leasehold.client import ApiError, OperatorClient
    from leasehold.protocol import tracing

    key = api_key(args)
    url = args.url or os.environ.get("LEASEHOLD_OPERATOR_URL") or DEFAULT_URL
    ca_file = args.ca_file or os.environ.get("LEASEHOLD_CA_FILE") or None

    async def session() -> T:
        async with OperatorClient(url, key, ca_file=ca_file) as api:
            return await body(api)

    # OTEL_* turn tracing on: each request is a span whose traceparent the Gateway continues.
    traced = tracing.configure("leasehold-cli")
    try:
        return asyncio.run(session())
    except ApiError as exc:
        raise CommandError(f"{exc.status} {exc.title}: {exc.detail}{_field_errors(exc.body)}") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise CommandError(f"cannot reach the operator API at {url}: {exc}") from exc
    finally:
        if traced:
            tracing.reset()  # exported before the command exits


def _field_errors(problem: Any) -> str:
    """A 422's field errors, one per clause (``body.targets: Input should be a valid dictionary``)."""
    errors = problem.get("errors") if isinstance(problem, dict) else None
    if not isinstance(errors, list):
        return ""
    parts = []
    for error in errors[:5]:
        if isinstance(error, dict):
            where = ".".join(str(p) for p in error.get("loc", ()))
            parts.append(f"{where}: {error.get('msg', '')}" if where else str(error.get("msg", "")))
    return f" ({'; '.join(parts)})" if parts else ""


def show(args: argparse.Namespace, item: Any, text: str) -> None:
    """One item: its JSON with ``--json``, else ``text``."""
    print(item.model_dump_json() if args.json else text)


def when(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


def asset_line(asset: Any) -> str:
    return f"{asset.kind:<10} {asset.value}  first seen {when(asset.first_seen_at)}  last seen {when(asset.last_seen_at)}"


def filters(args: argparse.Namespace) -> dict[str, Any]:
    if not 1 <= args.limit <= 500:
        raise CommandError("--limit must be between 1 and 500", EXIT_USAGE)
    return {"organization_id": args.organization, "created_from": args.created_from,
            "created_to": args.created_to}


async def listing(args: argparse.Namespace, fetch: Callable[..., Awaitable[Any]], line: Callable[[Any], str],
                  found: dict[str, Any]) -> int:
    """Print a cursor-paged list: one page, or every page with ``--all`` (the next cursor on stderr)."""
    cursor = args.cursor
    while True:
        page = await fetch(limit=args.limit, cursor=cursor, **found)
        for item in page.items:
            show(args, item, line(item))
        cursor = page.next_cursor
        if cursor is None:
            return EXIT_OK
        if not args.all:
            print(f"more: --cursor {cursor}", file=sys.stderr)
            return EXIT_OK


async def every(iterator: Any) -> list[Any]:
    return [item async for item in iterator]
