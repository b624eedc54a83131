"""``leasehold profiles`` (stored scan profiles) and ``leasehold schedules`` (scheduled scans)."""

from __future__ import annotations

import argparse
from typing import Any

from leasehold.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from leasehold.cli.operator.base import (
    Subparsers,
    command,
    connection,
    json_list,
    json_object,
    run,
    show,
    when,
)


def _steps(parser: argparse.ArgumentParser, required: bool) -> None:
    steps = parser.add_mutually_exclusive_group(required=required)
    steps.add_argument("--step", action="append", default=[], metavar="TASK_TYPE",
                       help="a step's task type, in order (repeat for more)")
    steps.add_argument("--steps", type=json_list, metavar="JSON",
                       help='the steps as a JSON array (or @FILE): [{"task_type": "tcp-connect"}, …]')


def _steps_of(args: argparse.Namespace) -> list[dict[str, Any]]:
    return list(args.steps) if args.steps is not None else [{"task_type": t} for t in args.step]


def register(subparsers: Subparsers) -> None:
    profiles = subparsers.add_parser(
        "profiles", help="stored scan profiles: create, list, show, replace, delete (operator API)",
        description="Named, stored scan profiles (ordered plugin steps) through the operator API.")
    commands = profiles.add_subparsers(dest="profiles_command", metavar="COMMAND", required=True)
    connection(command(commands, "list", "list the profiles the key can see",
                       "List the stored profiles the key can see: its organisation's and the global ones.",
                       _list_profiles))
    shown = command(commands, "show", "show a profile", "Show a stored profile with its steps.", _show_profile)
    shown.add_argument("profile_id", metavar="PROFILE_ID")
    connection(shown)
    create = command(commands, "create", "store a named profile",
                     "Store a named profile: its steps in order (--step, or --steps as JSON).", _create_profile)
    create.add_argument("name", metavar="NAME")
    _steps(create, required=True)
    create.add_argument("--organization", metavar="ORG_ID", help="its organisation (administrator keys)")
    create.add_argument("--global", dest="global_", action="store_true",
                        help="visible to every organisation (administrator keys only)")
    connection(create)
    replace = command(commands, "replace", "replace a profile's steps",
                      "Replace a stored profile's steps (scans already created keep theirs).", _replace_profile)
    replace.add_argument("profile_id", metavar="PROFILE_ID")
    _steps(replace, required=True)
    connection(replace)
    delete = command(commands, "delete", "delete a profile", "Delete a stored profile (its scans keep their steps).",
                     _delete_profile)
    delete.add_argument("profile_id", metavar="PROFILE_ID")
    connection(delete)

    schedules = subparsers.add_parser(
        "schedules", help="scheduled scans: create, list, show, pause, resume, run now, delete (operator API)",
        description="Scheduled scans through the operator API of a running Gateway.")
    commands = schedules.add_subparsers(dest="schedules_command", metavar="COMMAND", required=True)
    connection(command(commands, "list", "list the schedules the key can see", "List scheduled scans.",
                       _list_schedules))
    create = command(
        commands, "create", "create a scheduled scan",
        "Create a scheduled scan: its targets, its steps, and when (--cron or --every seconds).", _create_schedule)
    create.add_argument("name", metavar="NAME")
    create.add_argument("--organization", metavar="ORG_ID", help="its organisation (administrator keys)")
    create.add_argument("--target", action="append", default=[], metavar="TARGET",
                        help="a host name, address, network, host:port or URL (repeat for more)")
    create.add_argument("--targets", type=json_object, metavar="JSON",
                        help="the whole targets object as JSON (or @FILE), instead of --target")
    _steps(create, required=True)
    when_ = create.add_mutually_exclusive_group(required=True)
    when_.add_argument("--cron", metavar="EXPR", help="a cron expression (five fields)")
    when_.add_argument("--every", type=int, metavar="SECONDS", help="an interval in seconds")
    create.add_argument("--timezone", metavar="TZ", help="the cron expression's time zone (default UTC)")
    create.add_argument("--misfire-policy", choices=("run_once", "skip"),
                        help="run_once: one scan for any number of missed slots; skip: none when late by a period")
    connection(create)
    for name, help_, description, func in (
            ("show", "show a schedule", "Show a scheduled scan.", _show_schedule),
            ("pause", "pause a schedule", "Pause a scheduled scan.", _pause_schedule),
            ("resume", "resume a schedule", "Resume a scheduled scan (missed slots are not run).", _resume_schedule),
            ("run-now", "start one scan of a schedule now", "Start one scan of the schedule now; print its id.",
             _run_schedule),
            ("delete", "delete a schedule", "Delete a scheduled scan (its scans are kept).", _delete_schedule)):
        parser = command(commands, name, help_, description, func)
        parser.add_argument("schedule_id", metavar="SCHEDULE_ID")
        connection(parser)


def _profile_line(profile: Any) -> str:
    scope = f"org {profile.organization_id}" if profile.organization_id else "global"
    steps = " > ".join(str(step.get("task_type")) for step in profile.steps)
    return f"{profile.id}  {profile.name:<20} {scope}  v{profile.version}  steps {steps}"


def _list_profiles(args: argparse.Namespace) -> int:
    for profile in run(args, lambda api: api.list_profiles()).items:
        show(args, profile, _profile_line(profile))
    return EXIT_OK


def _show_profile(args: argparse.Namespace) -> int:
    profile = run(args, lambda api: api.get_profile(args.profile_id))
    show(args, profile, _profile_line(profile))
    return EXIT_OK


def _create_profile(args: argparse.Namespace) -> int:
    profile = run(args, lambda api: api.create_profile(args.name, _steps_of(args), organization_id=args.organization,
                                                       scope="global" if args.global_ else None))
    show(args, profile, _profile_line(profile))
    return EXIT_OK


def _replace_profile(args: argparse.Namespace) -> int:
    profile = run(args, lambda api: api.replace_profile(args.profile_id, _steps_of(args)))
    show(args, profile, _profile_line(profile))
    return EXIT_OK


def _delete_profile(args: argparse.Namespace) -> int:
    deleted = run(args, lambda api: api.delete_profile(args.profile_id))
    show(args, deleted, f"{deleted.profile_id}  deleted")
    return EXIT_OK


def _schedule_line(schedule: Any) -> str:
    timing = f"cron {schedule.cron} {schedule.timezone}" if schedule.cron else f"every {schedule.interval_seconds}s"
    state = "enabled" if schedule.enabled else "paused"
    return (f"{schedule.id}  {schedule.name:<20} {state:<7} {timing}  next {when(schedule.next_run_at)}"
            f"  last {when(schedule.last_run_at)}  org {schedule.organization_id}")


def _list_schedules(args: argparse.Namespace) -> int:
    for schedule in run(args, lambda api: api.list_schedules()).items:
        show(args, schedule, _schedule_line(schedule))
    return EXIT_OK


def _create_schedule(args: argparse.Namespace) -> int:
    if args.targets is not None and args.target:
        raise CommandError("give --targets alone, or --target", EXIT_USAGE)
    targets = args.targets if args.targets is not None else ({"targets": args.target} if args.target else {})
    schedule = run(args, lambda api: api.create_schedule(
        args.name, _steps_of(args), targets=targets, cron=args.cron, interval_seconds=args.every,
        timezone=args.timezone, misfire_policy=args.misfire_policy, organization_id=args.organization))
    show(args, schedule, _schedule_line(schedule))
    return EXIT_OK


def _show_schedule(args: argparse.Namespace) -> int:
    schedule = run(args, lambda api: api.get_schedule(args.schedule_id))
    show(args, schedule, _schedule_line(schedule))
    return EXIT_OK


def _pause_schedule(args: argparse.Namespace) -> int:
    schedule = run(args, lambda api: api.pause_schedule(args.schedule_id))
    show(args, schedule, _schedule_line(schedule))
    return EXIT_OK


def _resume_schedule(args: argparse.Namespace) -> int:
    schedule = run(args, lambda api: api.resume_schedule(args.schedule_id))
    show(args, schedule, _schedule_line(schedule))
    return EXIT_OK


def _run_schedule(args: argparse.Namespace) -> int:
    started = run(args, lambda api: api.run_schedule_now(args.schedule_id))
    show(args, started, str(started.scan_id))
    return EXIT_OK


def _delete_schedule(args: argparse.Namespace) -> int:
    deleted = run(args, lambda api: api.delete_schedule(args.schedule_id))
    show(args, deleted, f"{deleted.schedule_id}  deleted")
    return EXIT_OK
