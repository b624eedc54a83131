"""``leasehold scans``: list, show, create and cancel scans, and add a task to an ad hoc scan."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from leasehold.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from leasehold.cli.operator.base import (
    Subparsers,
    asset_line,
    command,
    connection,
    filters,
    json_list,
    json_object,
    listing,
    page_options,
    run,
    show,
    when,
)
from leasehold.cli.operator.tasks import print_task, task_line

SCAN_STATUSES = ("pending", "running", "success", "failed", "cancelled")


def register(subparsers: Subparsers) -> None:
    scans = subparsers.add_parser("scans", help="create, list, show and cancel scans (operator API)",
                                  description="Scans through the operator API of a running Gateway.")
    commands = scans.add_subparsers(dest="scans_command", metavar="COMMAND", required=True)

    listing_ = command(commands, "list", "list scans, newest first", "List scans, newest first, filtered.",
                       _list)
    listing_.add_argument("--status", choices=SCAN_STATUSES, help="only scans in this status")
    page_options(listing_)
    connection(listing_)

    shown = command(commands, "show", "show a scan with its jobs and tasks",
                    "Show a scan, its jobs in position order and each job's task.", _show)
    shown.add_argument("scan_id", metavar="SCAN_ID")
    connection(shown)

    create = command(
        commands, "create", "create a scan of targets with a profile's steps",
        "Create a scan: its targets (each --target, or the whole --targets object) and its steps (a stored "
        "profile's name, each --step's task type in order, or --steps as JSON). Every target is checked against "
        "the organisation's target policy. A scan without steps is ad hoc: add its tasks with `scans add-task`.",
        _create)
    create.add_argument("--organization", metavar="ORG_ID",
                        help="the scan's organisation (required with an administrator key)")
    create.add_argument("--target", action="append", default=[], metavar="TARGET",
                        help="a host name, address, network, host:port or URL (repeat for more)")
    create.add_argument("--ports", type=ports, metavar="PORTS",
                        help="ports the plugins should look at (e.g. 22,80,8000-8100)")
    create.add_argument("--targets", type=json_object, metavar="JSON",
                        help="the whole targets object as JSON (or @FILE), instead of --target/--ports")
    steps = create.add_mutually_exclusive_group()
    steps.add_argument("--profile", metavar="NAME", help="a stored profile's name (the organisation's, else global)")
    steps.add_argument("--step", action="append", default=[], metavar="TASK_TYPE",
                       help="a step's task type, in order (repeat for more)")
    steps.add_argument("--steps", type=json_list, metavar="JSON",
                       help='the steps as a JSON array (or @FILE): [{"task_type": "tcp-connect"}, …]')
    create.add_argument("--idempotency-key", metavar="KEY",
                        help="makes a retry safe: the same command with the same key answers with the scan the "
                             "first one created (kept 24 hours)")
    connection(create)

    cancel = command(commands, "cancel", "cancel a scan and its unfinished tasks",
                     "Cancel a scan: no further steps; pending tasks end at once, running ones are told to stop.",
                     _cancel)
    cancel.add_argument("scan_id", metavar="SCAN_ID")
    cancel.add_argument("--reason", help="why (recorded with the events)")
    connection(cancel)

    wait = command(commands, "wait", "wait until a scan ends",
                   "Wait until the scan ends, then print it. Exit 0 when it succeeded, 1 when it failed, was "
                   "cancelled or is still running after --timeout.", _wait)
    wait.add_argument("scan_id", metavar="SCAN_ID")
    wait.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS", help="give up after (default 600)")
    connection(wait)

    assets = command(commands, "assets", "the assets a scan found", "Print the assets a scan found.", _assets)
    assets.add_argument("scan_id", metavar="SCAN_ID")
    assets.add_argument("--limit", type=int, metavar="N", help="at most N assets")
    connection(assets)

    add = command(commands, "add-task", "queue a job on a scan and create its task",
                  "Queue a job on the scan and create its task (what an ad hoc scan is made of).", _add_task)
    add.add_argument("scan_id", metavar="SCAN_ID")
    add.add_argument("--type", dest="task_type", required=True, metavar="TASK_TYPE", help="the task type")
    add.add_argument("--scope", type=json_object, metavar="JSON", help="the task's scope as JSON (or @FILE)")
    add.add_argument("--parameters", type=json_object, metavar="JSON",
                     help="the task's parameters as JSON (or @FILE)")
    add.add_argument("--capability", action="append", default=[], metavar="NAME",
                     help="a capability the worker must have (repeat for more)")
    add.add_argument("--priority", type=int, metavar="N", help="higher first (default 0)")
    add.add_argument("--max-attempts", type=int, metavar="N", help="attempts before it fails for good")
    add.add_argument("--lease-seconds", type=int, metavar="N", help="lease length of each attempt")
    add.add_argument("--timeout-seconds", type=int, metavar="N", help="execution timeout of each attempt")
    add.add_argument("--idempotency-key", metavar="KEY",
                     help="makes a retry safe: the same command with the same key answers with the task the first "
                          "one created (kept 24 hours)")
    connection(add)


def ports(value: str) -> list[int | str]:
    """``22,80,8000-8100`` as the plugins read ports: numbers, and ranges as ``"a-b"`` (argparse type)."""
    found: list[int | str] = []
    for item in (part.strip() for part in value.split(",")):
        low, dash, high = item.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise argparse.ArgumentTypeError(f"not a port or a range of ports: {item!r}")
        found.append(item if dash else int(item))
    return found


def scan_line(scan: Any) -> str:
    return (f"{scan.id}  {scan.status:<9} {scan.execution_mode:<7} org {scan.organization_id}"
            f"  created {when(scan.created_at)}")


def _list(args: argparse.Namespace) -> int:
    found = {**filters(args), "status": args.status}
    return run(args, lambda api: listing(args, api.list_scans, scan_line, found))


def _show(args: argparse.Namespace) -> int:
    detail = run(args, lambda api: api.scan_detail(args.scan_id))
    if args.json:
        print(detail.model_dump_json())
        return EXIT_OK
    print(scan_line(detail.scan))
    print(f"targets: {detail.scan.targets}")
    print(f"jobs: {detail.job_count}")
    for job in detail.jobs:
        task = f"  task {task_line(job.task)}" if job.task is not None else ""
        print(f"  #{job.position} {job.plugin:<16} {job.status:<9}{task}")
    return EXIT_OK


def _create(args: argparse.Namespace) -> int:
    if args.targets is not None and (args.target or args.ports):
        raise CommandError("give --targets alone, or --target/--ports", EXIT_USAGE)
    targets: dict[str, Any] = args.targets if args.targets is not None else {}
    if args.target:
        targets["targets"] = args.target
    if args.ports:
        targets["ports"] = args.ports
    profile: list[dict[str, Any]] | str | None = (
        args.profile or args.steps or [{"task_type": t} for t in args.step] or None)
    scan = run(args, lambda api: api.create_scan(organization_id=args.organization, targets=targets,
                                                 profile=profile, idempotency_key=args.idempotency_key))
    show(args, scan, scan_line(scan))
    return EXIT_OK


def _wait(args: argparse.Namespace) -> int:
    async def ended(api: Any) -> Any:
        try:
            async with asyncio.timeout(args.timeout):
                return await api.wait_for_scan(args.scan_id)
        except TimeoutError:
            scan = await api.get_scan(args.scan_id)
            raise CommandError(f"scan {scan.id} is still {scan.status} after {args.timeout:g} s") from None

    scan = run(args, ended)
    show(args, scan, scan_line(scan))
    if scan.status != "success":
        raise CommandError(f"scan {scan.id} ended {scan.status}")
    return EXIT_OK


def _assets(args: argparse.Namespace) -> int:
    for asset in run(args, lambda api: api.scan_assets(args.scan_id, limit=args.limit)).items:
        show(args, asset, asset_line(asset))
    return EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    cancelled = run(args, lambda api: api.cancel_scan(args.scan_id, reason=args.reason))
    show(args, cancelled, f"{cancelled.scan_id}  cancel requested"
         + "".join(f"\n  task {t.get('id')}  {t.get('state')}" for t in cancelled.tasks))
    return EXIT_OK


def _add_task(args: argparse.Namespace) -> int:
    spec = {name: value for name, value in (
        ("scope", args.scope), ("parameters", args.parameters), ("priority", args.priority),
        ("max_attempts", args.max_attempts), ("lease_seconds", args.lease_seconds),
        ("execution_timeout_seconds", args.timeout_seconds),
        ("required_capabilities", args.capability or None)) if value is not None}
    task = run(args, lambda api: api.create_task(args.scan_id, args.task_type,
                                                 idempotency_key=args.idempotency_key, **spec))
    print_task(args, task)
    return EXIT_OK
