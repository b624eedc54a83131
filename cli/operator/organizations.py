"""``leasehold organizations``: create, list and show organisations; their target policy, fair
share and admission caps. ``leasehold counts``: tasks by state, scans by status and each organisation's queue."""

from __future__ import annotations

import argparse
from typing import Any

from leasehold.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from leasehold.cli.operator.base import Subparsers, asset_line, command, connection, every, run, show, when


def register(subparsers: Subparsers) -> None:
    orgs = subparsers.add_parser(
        "organizations", help="create, list and show organisations; target policy, fair share, admission "
        "(operator API)", description="Organisations through the operator API of a running Gateway.")
    commands = orgs.add_subparsers(dest="organizations_command", metavar="COMMAND", required=True)

    create = command(commands, "create", "create an organisation (administrator)",
                     "Create an organisation; print it (its id first).", _create)
    create.add_argument("name", metavar="NAME")
    connection(create)

    listing = command(commands, "list", "list organisations", "List the organisations the key can see.", _list)
    connection(listing)

    shown = command(commands, "show", "show an organisation", "Show an organisation.", _show)
    shown.add_argument("organization_id", metavar="ORG_ID")
    connection(shown)

    policy = command(
        commands, "target-policy", "show or replace an organisation's target policy",
        "Show the organisation's target policy; with --allow/--deny/--clear, replace it (opening a "
        "default-denied network needs an administrator key).", _policy)
    policy.add_argument("organization_id", metavar="ORG_ID")
    policy.add_argument("--allow", action="append", default=[], metavar="ENTRY",
                        help="a network (CIDR) or domain to allow (repeat for more)")
    policy.add_argument("--deny", action="append", default=[], metavar="ENTRY",
                        help="a network (CIDR) or domain to deny (repeat for more)")
    policy.add_argument("--clear", action="store_true", help="replace it with an empty policy")
    connection(policy)

    share = command(
        commands, "fair-share", "show or set an organisation's fair share",
        "Show the organisation's fair-share weight, cap and counters; with --weight and --max-live-attempts or "
        "--no-cap, set them (administrator).", _fair_share)
    share.add_argument("organization_id", metavar="ORG_ID")
    share.add_argument("--weight", type=int, metavar="N", help="its weight, 1..1000")
    cap = share.add_mutually_exclusive_group()
    cap.add_argument("--max-live-attempts", type=int, metavar="N", help="cap of its live attempts across the fleet")
    cap.add_argument("--no-cap", action="store_true", help="no cap")
    connection(share)

    admission = command(
        commands, "admission", "show or set an organisation's admission caps",
        "Show the organisation's caps of queued tasks and queued scans and what they count now; with "
        "--max-queued-tasks N or --no-task-cap, --max-queued-scans M or --no-scan-cap, and --reason, set "
        "them (administrator). Creations past a cap answer 429.", _admission)
    admission.add_argument("organization_id", metavar="ORG_ID")
    tasks = admission.add_mutually_exclusive_group()
    tasks.add_argument("--max-queued-tasks", type=int, metavar="N", help="cap of its tasks queued (pending, retry_wait)")
    tasks.add_argument("--no-task-cap", action="store_true", help="no cap of queued tasks")
    scans = admission.add_mutually_exclusive_group()
    scans.add_argument("--max-queued-scans", type=int, metavar="M", help="cap of its scans queued (pending, not started)")
    scans.add_argument("--no-scan-cap", action="store_true", help="no cap of queued scans")
    admission.add_argument("--reason", metavar="TEXT", help="why (recorded on the event; required to set)")
    connection(admission)

    for name, help_, description, func in (
            ("assets", "an organisation's assets", "Print the assets the organisation's scans found.", _assets),
            ("threats", "an organisation's threats", "Print the threats the organisation's scans found.", _threats)):
        parser = command(commands, name, help_, description, func)
        parser.add_argument("organization_id", metavar="ORG_ID")
        parser.add_argument("--limit", type=int, metavar="N", help="at most N items")
        connection(parser)


def register_counts(subparsers: Subparsers) -> None:
    counts = subparsers.add_parser(
        "counts", help="tasks by state, scans by status and queues per organisation (operator API)",
        description="Tasks by state, scans by status, and each organisation's queue: depth, ready tasks and "
                    "how long the oldest ready one has waited.")
    counts.add_argument("--organization", metavar="ORG_ID", help="only this organisation")
    connection(counts)
    counts.set_defaults(func=_counts)


def _line(org: Any) -> str:
    return f"{org.id}  {org.name}  created {when(org.created_at)}"


def _create(args: argparse.Namespace) -> int:
    org = run(args, lambda api: api.create_organization(args.name))
    show(args, org, _line(org))
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    for org in run(args, lambda api: every(api.iter_organizations())):
        show(args, org, _line(org))
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    org = run(args, lambda api: api.get_organization(args.organization_id))
    show(args, org, f"{_line(org)}  gateway execution {'on' if org.gateway_execution else 'off'}")
    return EXIT_OK


def _policy(args: argparse.Namespace) -> int:
    if args.clear and (args.allow or args.deny):
        raise CommandError("--clear replaces the policy with an empty one: give it alone", EXIT_USAGE)
    if args.clear or args.allow or args.deny:
        policy = run(args, lambda api: api.set_target_policy(args.organization_id, allow=args.allow, deny=args.deny))
    else:
        policy = run(args, lambda api: api.get_target_policy(args.organization_id))
    show(args, policy, f"organisation {policy.organization_id}\n  allow: {', '.join(policy.allow) or '-'}"
         f"\n  deny: {', '.join(policy.deny) or '-'}\n  denied by default: {', '.join(policy.denied_by_default)}")
    return EXIT_OK


def _fair_share(args: argparse.Namespace) -> int:
    setting = args.weight is not None or args.max_live_attempts is not None or args.no_cap
    if setting:
        if args.weight is None or (args.max_live_attempts is None and not args.no_cap):
            raise CommandError("to set the fair share give --weight and --max-live-attempts N or --no-cap",
                               EXIT_USAGE)
        share = run(args, lambda api: api.set_fair_share(args.organization_id, weight=args.weight,
                                                         max_live_attempts=args.max_live_attempts))
    else:
        share = run(args, lambda api: api.get_fair_share(args.organization_id))
    cap = share.max_live_attempts if share.max_live_attempts is not None else "none"
    show(args, share, f"organisation {share.organization_id}  weight {share.weight}  cap {cap}"
         f"  live {share.live_attempts}  leases served {share.leases_served}")
    return EXIT_OK


def _admission(args: argparse.Namespace) -> int:
    tasks_said = args.max_queued_tasks is not None or args.no_task_cap
    scans_said = args.max_queued_scans is not None or args.no_scan_cap
    if tasks_said or scans_said or args.reason is not None:
        if not (tasks_said and scans_said and args.reason):
            raise CommandError("to set the admission caps give --max-queued-tasks N or --no-task-cap, "
                               "--max-queued-scans M or --no-scan-cap, and --reason", EXIT_USAGE)
        state = run(args, lambda api: api.set_admission(args.organization_id, max_queued_tasks=args.max_queued_tasks,
                                                        max_queued_scans=args.max_queued_scans, reason=args.reason))
    else:
        state = run(args, lambda api: api.get_admission(args.organization_id))

    def cap(value: int | None) -> str:
        return "none" if value is None else str(value)

    show(args, state, f"organisation {state.organization_id}  queued tasks {state.queued_tasks}"
         f" (cap {cap(state.max_queued_tasks)})  queued scans {state.queued_scans} (cap {cap(state.max_queued_scans)})")
    return EXIT_OK


def _assets(args: argparse.Namespace) -> int:
    for asset in run(args, lambda api: api.organization_assets(args.organization_id, limit=args.limit)).items:
        show(args, asset, asset_line(asset))
    return EXIT_OK


def _threats(args: argparse.Namespace) -> int:
    for threat in run(args, lambda api: api.organization_threats(args.organization_id, limit=args.limit)).items:
        show(args, threat, f"{threat.severity:<8} {threat.external_id:<20} {threat.title}"
                           f"  last seen {when(threat.last_seen_at)}")
    return EXIT_OK


def _counts(args: argparse.Namespace) -> int:
    counts = run(args, lambda api: api.counts(organization_id=args.organization))
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
