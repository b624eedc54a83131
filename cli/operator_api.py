"""``leasehold scans|tasks|workers|counts``: find work through the operator API.

Every command talks to a running Gateway's operator API with the Python client
(:mod:`leasehold.client`), so it needs neither the database nor the ``server`` extra:

* ``--url`` (or ``LEASEHOLD_OPERATOR_URL``; default ``https://localhost:8444``),
* the API key from ``LEASEHOLD_API_KEY`` or ``--api-key-file FILE`` (never on the command line,
  where ``ps`` would show it),
* ``--ca-file`` (or ``LEASEHOLD_CA_FILE``): the CA of the Gateway's certificate (default: the
  system's trust store).

Lists print one line per item (``--json``: one JSON object per line), newest first, one page
(``--limit``, at most 500); ``--all`` follows the cursors to the end, otherwise the next page's
cursor goes to stderr. Exit codes: 0 success, 1 an API error (its status, title and detail on
stderr) or an unreachable Gateway, 2 a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from leasehold.cli.main import EXIT_OK, EXIT_USAGE, CommandError

__all__ = ["register"]

T = TypeVar("T")
DEFAULT_URL = "https://localhost:8444"
TASK_STATES = ("pending", "leased", "running", "retry_wait", "completed", "failed_terminal", "cancelling",
               "cancelled")
SCAN_STATUSES = ("pending", "running", "success", "failed", "cancelled")


def _time(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {value!r}") from exc
    if parsed.tzinfo is None:
        raise argparse.ArgumentTypeError(f"give the time with its offset (e.g. {value}Z or {value}+00:00)")
    return parsed


def _connection(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument("--url", metavar="URL",
                       help=f"the Gateway's operator API (default: env LEASEHOLD_OPERATOR_URL, else {DEFAULT_URL})")
    group.add_argument("--api-key-file", type=Path, metavar="FILE",
                       help="file holding the operator API key (default: env LEASEHOLD_API_KEY)")
    group.add_argument("--ca-file", metavar="FILE",
                       help="CA certificate of the Gateway's TLS certificate (default: env LEASEHOLD_CA_FILE, "
                            "else the system trust store)")
    group.add_argument("--json", action="store_true", help="print JSON (one object per line) instead of text")


def _page(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--organization", metavar="ORG_ID", help="only this organisation (administrator keys)")
    parser.add_argument("--created-from", type=_time, metavar="TIME",
                        help="only items created at or after TIME (ISO 8601 with offset)")
    parser.add_argument("--created-to", type=_time, metavar="TIME",
                        help="only items created before TIME (ISO 8601 with offset)")
    parser.add_argument("--limit", type=int, default=50, metavar="N", help="items per page, 1..500 (default 50)")
    parser.add_argument("--cursor", metavar="CURSOR", help="the next page's cursor, as a previous list printed it")
    parser.add_argument("--all", action="store_true", help="follow the cursors: every matching item")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``scans``, ``tasks``, ``workers`` and ``counts`` to the ``leasehold`` CLI."""
    scans = subparsers.add_parser("scans", help="list and show scans (operator API)",
                                  description="Find scans through the operator API of a running Gateway.")
    scan_commands = scans.add_subparsers(dest="scans_command", metavar="COMMAND", required=True)
    listing = scan_commands.add_parser("list", help="list scans, newest first",
                                       description="List scans, newest first, filtered.")
    listing.add_argument("--status", choices=SCAN_STATUSES, help="only scans in this status")
    _page(listing)
    _connection(listing)
    listing.set_defaults(func=_list_scans)
    show = scan_commands.add_parser("show", help="show a scan with its jobs and tasks",
                                    description="Show a scan, its jobs in position order and each job's task.")
    show.add_argument("scan_id", metavar="SCAN_ID")
    _connection(show)
    show.set_defaults(func=_show_scan)

    tasks = subparsers.add_parser("tasks", help="list, show and retry tasks (operator API)",
                                  description="Find and retry tasks through the operator API of a running Gateway.")
    task_commands = tasks.add_subparsers(dest="tasks_command", metavar="COMMAND", required=True)
    listing = task_commands.add_parser("list", help="list tasks, newest first",
                                       description="List tasks, newest first, filtered.")
    listing.add_argument("--state", choices=TASK_STATES, help="only tasks in this state")
    listing.add_argument("--type", dest="task_type", metavar="TASK_TYPE", help="only tasks of this type")
    listing.add_argument("--scan", metavar="SCAN_ID", help="only this scan's tasks")
    listing.add_argument("--worker", metavar="WORKER_ID", help="only tasks whose latest attempt is this worker's")
    _page(listing)
    _connection(listing)
    listing.set_defaults(func=_list_tasks)
    show = task_commands.add_parser("show", help="show a task with its attempts",
                                    description="Show a task with every attempt, oldest first.")
    show.add_argument("task_id", metavar="TASK_ID")
    _connection(show)
    show.set_defaults(func=_show_task)
    retry = task_commands.add_parser(
        "retry", help="retry a failed_terminal task with fresh attempts",
        description="Put a failed_terminal task back to pending (recorded as a TaskRetried event). Its "
                    "max_attempts becomes the attempts made plus --attempts (default: its max_attempts so far).")
    retry.add_argument("task_id", metavar="TASK_ID")
    retry.add_argument("--reason", help="why (recorded with the event)")
    retry.add_argument("--attempts", type=int, metavar="N", help="fresh attempts, 1..100")
    _connection(retry)
    retry.set_defaults(func=_retry_task)

    workers = subparsers.add_parser("workers", help="list workers with last seen and live leases (operator API)",
                                    description="Find workers through the operator API of a running Gateway.")
    worker_commands = workers.add_subparsers(dest="workers_command", metavar="COMMAND", required=True)
    listing = worker_commands.add_parser(
        "list", help="list workers: liveness, last seen, live leases, warnings",
        description="List every worker the key can see, with its liveness (live, idle or gone: from its last "
                    "poll, renewal or write, which the Gateways publish every presence_publish_seconds), its "
                    "last poll, when it was last seen on an attempt, its live leases and any warning (such as no "
                    "task types).")
    listing.add_argument("--liveness", choices=("live", "idle", "gone"), help="only the workers in this state")
    _connection(listing)
    listing.set_defaults(func=_list_workers)

    counts = subparsers.add_parser(
        "counts", help="tasks by state, scans by status and queues per organisation (operator API)",
        description="Tasks by state, scans by status, and each organisation's queue: depth, ready tasks and "
                    "how long the oldest ready one has waited.")
    counts.add_argument("--organization", metavar="ORG_ID", help="only this organisation")
    _connection(counts)
    counts.set_defaults(func=_counts)


# --- running a command -------------------------------------------------------------------------


def _api_key(args: argparse.Namespace) -> str:
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


def _run(args: argparse.Namespace, body: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``body(client)`` against the operator API; API and connection errors as one line."""
    import aiohttp

    from leasehold.client import ApiError, OperatorClient

    key = _api_key(args)
    url = args.url or os.environ.get("LEASEHOLD_OPERATOR_URL") or DEFAULT_URL
    ca_file = args.ca_file or os.environ.get("LEASEHOLD_CA_FILE") or None

    async def session() -> T:
        async with OperatorClient(url, key, ca_file=ca_file) as api:
            return await body(api)

    try:
        return asyncio.run(session())
    except ApiError as exc:
        raise CommandError(f"{exc.status} {exc.title}: {exc.detail}") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise CommandError(f"cannot reach the operator API at {url}: {exc}") from exc


def _print(args: argparse.Namespace, item: Any, text: str) -> None:
    print(item.model_dump_json() if args.json else text)


def _when(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    if not 1 <= args.limit <= 500:
        raise CommandError("--limit must be between 1 and 500", EXIT_USAGE)
    return {"organization_id": args.organization, "created_from": args.created_from,
            "created_to": args.created_to}


def _scan_line(scan: Any) -> str:
    return f"{scan.id}  {scan.status:<9} {scan.execution_mode:<7} org {scan.organization_id}  created {_when(scan.created_at)}"


def _task_line(task: Any) -> str:
    worker = f"  worker {task.worker_id}" if task.worker_id else ""
    return (f"{task.id}  {task.state:<15} {task.task_type:<16} attempts {task.attempt_count}/{task.max_attempts}"
            f"  scan {task.scan_id}  created {_when(task.created_at)}{worker}")


async def _listing(args: argparse.Namespace, fetch: Callable[..., Awaitable[Any]], line: Callable[[Any], str],
                   filters: dict[str, Any]) -> int:
    cursor = args.cursor
    while True:
        page = await fetch(limit=args.limit, cursor=cursor, **filters)
        for item in page.items:
            _print(args, item, line(item))
        cursor = page.next_cursor
        if cursor is None:
            return EXIT_OK
        if not args.all:
            print(f"more: --cursor {cursor}", file=sys.stderr)
            return EXIT_OK


def _list_scans(args: argparse.Namespace) -> int:
    filters = {**_filters(args), "status": args.status}
    return _run(args, lambda api: _listing(args, api.list_scans, _scan_line, filters))


def _list_tasks(args: argparse.Namespace) -> int:
    filters = {**_filters(args), "state": args.state, "task_type": args.task_type, "scan_id": args.scan,
               "worker_id": args.worker}
    return _run(args, lambda api: _listing(args, api.list_tasks, _task_line, filters))


def _show_scan(args: argparse.Namespace) -> int:
    detail = _run(args, lambda api: api.scan_detail(args.scan_id))
    if args.json:
        print(detail.model_dump_json())
        return EXIT_OK
    print(_scan_line(detail.scan))
    print(f"jobs: {detail.job_count}")
    for job in detail.jobs:
        task = f"  task {_task_line(job.task)}" if job.task is not None else ""
        print(f"  #{job.position} {job.plugin:<16} {job.status:<9}{task}")
    return EXIT_OK


def _show_task(args: argparse.Namespace) -> int:
    task = _run(args, lambda api: api.get_task(args.task_id))
    _print_task(args, task)
    return EXIT_OK


def _print_task(args: argparse.Namespace, task: Any) -> None:
    if args.json:
        print(task.model_dump_json())
        return
    print(f"{task.id}  {task.state}  {task.task_type}  attempts {task.attempt_count}/{task.max_attempts}")
    print(f"  scan {task.scan_id}  org {task.organization_id}  created {_when(task.created_at)}"
          f"  finished {_when(task.finished_at)}")
    if task.last_error:
        print(f"  last error: {task.last_error}")
    for attempt in task.attempts:
        error = f"  error: {attempt.error}" if attempt.error else ""
        print(f"  attempt #{attempt.attempt_number} {attempt.status:<9} worker {attempt.worker_id}"
              f"  leased {_when(attempt.leased_at)}  finished {_when(attempt.finished_at)}{error}")


def _retry_task(args: argparse.Namespace) -> int:
    task = _run(args, lambda api: api.retry_task(args.task_id, reason=args.reason, attempts=args.attempts))
    _print_task(args, task)
    return EXIT_OK


def _list_workers(args: argparse.Namespace) -> int:
    async def every(api: Any) -> list[Any]:
        return [worker async for worker in api.iter_workers(liveness=args.liveness)]

    for worker in _run(args, every):
        state = "revoked" if worker.revoked_at else "enabled" if worker.enabled else "disabled"
        text = (f"{worker.id}  {worker.name:<20} {state:<8} {worker.liveness:<4}"
                f"  last poll {_when(worker.last_poll_at)}  last seen {_when(worker.last_seen_at)}"
                f"  leases {len(worker.live_leases)}/{worker.max_concurrent_tasks}"
                f"  types {','.join(worker.task_types) or '-'}")
        text += "".join(f"\n  warning: {w}" for w in worker.warnings)
        _print(args, worker, text)
    return EXIT_OK


def _counts(args: argparse.Namespace) -> int:
    counts = _run(args, lambda api: api.counts(organization_id=args.organization))
    if args.json:
        print(counts.model_dump_json())
        return EXIT_OK
    for org in counts.organizations:
        queue = org.queue
        age = f"{queue.oldest_ready_age_seconds:.1f}s" if queue.oldest_ready_age_seconds is not None else "-"
        print(f"organisation {org.organization_id}: queue {queue.depth} (ready {queue.ready}, oldest waiting {age})")
        print("  tasks: " + " ".join(f"{state}={n}" for state, n in org.tasks_by_state.items()))
        print("  scans: " + " ".join(f"{status}={n}" for status, n in org.scans_by_status.items()))
    return EXIT_OK
