"""``leasehold tasks``: list, show, retry and cancel tasks, and read a task's history."""

from __future__ import annotations

import argparse
from typing import Any

from leasehold.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from leasehold.cli.operator.base import (
    Subparsers,
    command,
    connection,
    filters,
    listing,
    page_options,
    run,
    when,
)

TASK_STATES = ("pending", "leased", "running", "retry_wait", "completed", "failed_terminal", "cancelling",
               "cancelled")


def register(subparsers: Subparsers) -> None:
    tasks = subparsers.add_parser("tasks", help="list, show, retry and cancel tasks; their history (operator API)",
                                  description="Tasks through the operator API of a running Gateway.")
    commands = tasks.add_subparsers(dest="tasks_command", metavar="COMMAND", required=True)

    listing_ = command(commands, "list", "list tasks, newest first", "List tasks, newest first, filtered.", _list)
    listing_.add_argument("--state", choices=TASK_STATES, help="only tasks in this state")
    listing_.add_argument("--type", dest="task_type", metavar="TASK_TYPE", help="only tasks of this type")
    listing_.add_argument("--scan", metavar="SCAN_ID", help="only this scan's tasks")
    listing_.add_argument("--worker", metavar="WORKER_ID", help="only tasks whose latest attempt is this worker's")
    page_options(listing_)
    connection(listing_)

    shown = command(commands, "show", "show a task with its attempts",
                    "Show a task with every attempt, oldest first.", _show)
    shown.add_argument("task_id", metavar="TASK_ID")
    connection(shown)

    retry = command(
        commands, "retry", "retry a failed_terminal task with fresh attempts",
        "Put a failed_terminal task back to pending (recorded as a TaskRetried event). Its max_attempts becomes "
        "the attempts made plus --attempts (default: its max_attempts so far).", _retry)
    retry.add_argument("task_id", metavar="TASK_ID")
    retry.add_argument("--reason", help="why (recorded with the event)")
    retry.add_argument("--attempts", type=int, metavar="N", help="fresh attempts, 1..100")
    connection(retry)

    cancel = command(commands, "cancel", "cancel a task",
                     "Cancel a task: before a lease at once; leased or running, its worker is told to stop "
                     "(the task is cancelling until the worker acknowledges or its lease runs out).", _cancel)
    cancel.add_argument("task_id", metavar="TASK_ID")
    cancel.add_argument("--reason", help="why (recorded with the event)")
    connection(cancel)

    events = command(commands, "events", "a task's history for auditors, oldest first",
                     "Print a task's events, oldest first: version, type, when, actor (--json: each event whole).",
                     _events)
    events.add_argument("task_id", metavar="TASK_ID")
    events.add_argument("--limit", type=int, default=100, metavar="N", help="events per request, 1..500")
    connection(events)


def task_line(task: Any) -> str:
    worker = f"  worker {task.worker_id}" if task.worker_id else ""
    return (f"{task.id}  {task.state:<15} {task.task_type:<16} attempts {task.attempt_count}/{task.max_attempts}"
            f"  scan {task.scan_id}  created {when(task.created_at)}{worker}")


def print_task(args: argparse.Namespace, task: Any) -> None:
    if args.json:
        print(task.model_dump_json())
        return
    print(f"{task.id}  {task.state}  {task.task_type}  attempts {task.attempt_count}/{task.max_attempts}")
    print(f"  scan {task.scan_id}  org {task.organization_id}  created {when(task.created_at)}"
          f"  finished {when(task.finished_at)}")
    if task.last_error:
        print(f"  last error: {task.last_error}")
    for attempt in task.attempts:
        error = f"  error: {attempt.error}" if attempt.error else ""
        print(f"  attempt #{attempt.attempt_number} {attempt.status:<9} worker {attempt.worker_id}"
              f"  leased {when(attempt.leased_at)}  finished {when(attempt.finished_at)}{error}")


def _list(args: argparse.Namespace) -> int:
    found = {**filters(args), "state": args.state, "task_type": args.task_type, "scan_id": args.scan,
             "worker_id": args.worker}
    return run(args, lambda api: listing(args, api.list_tasks, task_line, found))


def _show(args: argparse.Namespace) -> int:
    print_task(args, run(args, lambda api: api.get_task(args.task_id)))
    return EXIT_OK


def _retry(args: argparse.Namespace) -> int:
    print_task(args, run(args, lambda api: api.retry_task(args.task_id, reason=args.reason, attempts=args.attempts)))
    return EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    print_task(args, run(args, lambda api: api.cancel_task(args.task_id, reason=args.reason)))
    return EXIT_OK


def _events(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 500:
        raise CommandError("--limit must be between 1 and 500", EXIT_USAGE)

    async def history(api: Any) -> list[Any]:
        found: list[Any] = []
        after: int | None = None
        while True:
            page = await api.task_events(args.task_id, limit=args.limit, after_version=after)
            found.extend(page.items)
            if page.next_after_version is None:
                return found
            after = page.next_after_version

    for event in run(args, history):
        print(event.model_dump_json() if args.json
              else f"v{event.version:<4} {event.type:<24} {when(event.recorded_at)}  {event.actor}")
    return EXIT_OK
