"""``leasehold bulk``: cancel or retry every task a filter selects, as a tracked operation that
runs in the Gateway (and survives its restart); list, show, stop operations and read what each
did to every task."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from leasehold.cli.main import EXIT_OK
from leasehold.cli.operator.base import Subparsers, command, connection, iso_time, run, show, when
from leasehold.cli.operator.tasks import TASK_STATES


def _filters(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("which tasks (as `tasks list` filters them)")
    group.add_argument("--organization", metavar="ORG_ID", help="the organisation's tasks (an organisation key: its own)")
    group.add_argument("--state", choices=TASK_STATES, help="tasks in this state")
    group.add_argument("--type", dest="task_type", metavar="TASK_TYPE", help="tasks of this type")
    group.add_argument("--scan", metavar="SCAN_ID", help="the scan's tasks")
    group.add_argument("--worker", metavar="WORKER_ID", help="tasks whose latest attempt is this worker's")
    group.add_argument("--created-from", type=iso_time, metavar="TIME", help="created at or after TIME")
    group.add_argument("--created-to", type=iso_time, metavar="TIME", help="created before TIME")


def _selection(args: argparse.Namespace) -> dict[str, Any]:
    return {"organization_id": args.organization, "state": args.state, "task_type": args.task_type,
            "scan_id": args.scan, "worker_id": args.worker, "created_from": args.created_from,
            "created_to": args.created_to}


def register(subparsers: Subparsers) -> None:
    bulk = subparsers.add_parser(
        "bulk", help="cancel or retry every task a filter selects, tracked (operator API)",
        description="Bulk operations through the operator API: `bulk cancel` or `bulk retry` with the task list's "
                    "filters (--preview: only count them), then `bulk show` for progress and `bulk tasks` for each "
                    "task's outcome. The operation runs in the Gateway, carries on after a Gateway restart, and "
                    "reaches each task once.")
    commands = bulk.add_subparsers(dest="bulk_command", metavar="COMMAND", required=True)
    for action, help_, description in (
            ("cancel", "cancel every task the filter selects",
             "Cancel every task the filter selects now (pending ones at once, running ones are told to stop)."),
            ("retry", "retry every failed_terminal task the filter selects",
             "Retry every task the filter selects now; those not failed_terminal are skipped (and say why).")):
        parser = command(commands, action, help_, description, _start)
        parser.set_defaults(action=action)
        _filters(parser)
        parser.add_argument("--preview", action="store_true", help="only print how many tasks the filter selects")
        parser.add_argument("--reason", help="why (recorded with each task's events, with the operation's id)")
        if action == "retry":
            parser.add_argument("--attempts", type=int, metavar="N", help="fresh attempts per task, 1..100")
        parser.add_argument("--wait", action="store_true", help="wait until it has run, printing progress to stderr")
        parser.add_argument("--idempotency-key", metavar="KEY",
                            help="makes a retry of this command safe: the same key answers with the first operation")
        connection(parser)

    connection(command(commands, "list", "list bulk operations, newest first",
                       "List the bulk operations the key can see, newest first.", _list))
    shown = command(commands, "show", "show a bulk operation and its progress",
                    "Show a bulk operation: its action, filter, who started it and its progress.", _show)
    shown.add_argument("operation_id", metavar="OPERATION_ID")
    shown.add_argument("--wait", action="store_true", help="wait until it has run, printing progress to stderr")
    connection(shown)
    tasks = command(commands, "tasks", "what a bulk operation did to each task",
                    "Print each task the operation reached: done, skipped (and why) or failed.", _tasks)
    tasks.add_argument("operation_id", metavar="OPERATION_ID")
    connection(tasks)
    stop = command(commands, "stop", "stop a bulk operation",
                   "Stop a bulk operation: the tasks it reached stay as they are, no further ones.", _stop)
    stop.add_argument("operation_id", metavar="OPERATION_ID")
    connection(stop)


def _line(op: Any) -> str:
    return (f"{op.id}  {op.action:<6} {op.status:<8} {op.done + op.skipped + op.failed}/{op.total}"
            f" (done {op.done}, skipped {op.skipped}, failed {op.failed})  by {op.actor}"
            f"  started {when(op.started_at)}")


def _progress(op: Any) -> None:
    print(f"{op.id}: {op.done + op.skipped + op.failed}/{op.total} reached", file=sys.stderr)


async def _waited(api: Any, operation_id: Any, wait: bool) -> Any:
    return await api.wait_for_bulk(operation_id, progress=_progress) if wait else await api.get_bulk(operation_id)


def _start(args: argparse.Namespace) -> int:
    selection = _selection(args)
    if args.preview:
        preview = run(args, lambda api: api.preview_bulk(args.action, **selection))
        show(args, preview, f"{preview.matched} tasks would be {'cancelled' if args.action == 'cancel' else 'retried'}")
        return EXIT_OK

    async def started(api: Any) -> Any:
        op = await api.start_bulk(args.action, reason=args.reason, attempts=getattr(args, "attempts", None),
                                  idempotency_key=args.idempotency_key, **selection)
        return await _waited(api, op.id, args.wait)

    op = run(args, started)
    show(args, op, _line(op))
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    for op in run(args, lambda api: api.list_bulk()).items:
        show(args, op, _line(op))
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    op = run(args, lambda api: _waited(api, args.operation_id, args.wait))
    show(args, op, f"{_line(op)}\n  filter {op.filter}\n  reason: {op.reason}")
    return EXIT_OK


def _tasks(args: argparse.Namespace) -> int:
    async def every(api: Any) -> list[Any]:
        found: list[Any] = []
        after = None
        while True:
            page = await api.bulk_tasks(args.operation_id, limit=500, after=after)
            found += page.items
            if page.next_after is None:
                return found
            after = page.next_after

    for outcome in run(args, every):
        detail = f"  {outcome.detail}" if outcome.detail else ""
        show(args, outcome, f"{outcome.task_id}  {outcome.outcome:<7}{detail}")
    return EXIT_OK


def _stop(args: argparse.Namespace) -> int:
    op = run(args, lambda api: api.stop_bulk(args.operation_id))
    show(args, op, _line(op))
    return EXIT_OK


__all__ = ["register"]
