"""``leasehold workers``: register workers, assign them to organisations, change, disable, enable,
revoke them, and list them with their liveness."""

from __future__ import annotations

import argparse
import hashlib
import ssl
from pathlib import Path
from typing import Any

from leasehold.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from leasehold.cli.operator.base import Subparsers, command, connection, every, run, show, when


def register(subparsers: Subparsers) -> None:
    workers = subparsers.add_parser(
        "workers", help="register, assign, change, disable and list workers (operator API)",
        description="Workers through the operator API of a running Gateway (changes need an administrator key).")
    commands = workers.add_subparsers(dest="workers_command", metavar="COMMAND", required=True)

    listing = command(
        commands, "list", "list workers: liveness, last seen, live leases, warnings",
        "List every worker the key can see, with its liveness (live, idle or gone: from its last poll, renewal or "
        "write, which the Gateways publish every presence_publish_seconds), its last poll, when it was last seen "
        "on an attempt, its live leases and any warning (such as no task types).", _list)
    listing.add_argument("--liveness", choices=("live", "idle", "gone"), help="only the workers in this state")
    connection(listing)

    shown = command(commands, "show", "show a worker", "Show a worker with its assignments and live leases.", _show)
    shown.add_argument("worker_id", metavar="WORKER_ID")
    connection(shown)

    reg = command(
        commands, "register", "register a worker by its certificate",
        "Register a worker by its client certificate (--cert FILE, a PEM file; or --fingerprint, the SHA-256 of "
        "its DER in hex). A worker with no task types can get no work (the answer warns).", _register)
    reg.add_argument("--name", required=True, help="the worker's name")
    which = reg.add_mutually_exclusive_group(required=True)
    which.add_argument("--cert", type=Path, metavar="FILE", help="the worker's certificate (PEM)")
    which.add_argument("--fingerprint", metavar="HEX", help="SHA-256 fingerprint of the certificate (64 hex)")
    _capacities(reg)
    reg.add_argument("--organization", action="append", default=[], metavar="ORG_ID",
                     help="assign it to this organisation too (repeat for more)")
    connection(reg)

    update = command(commands, "update", "change a worker's task types, capabilities or capacity",
                     "Change what is given; the rest stays.", _update)
    update.add_argument("worker_id", metavar="WORKER_ID")
    _capacities(update)
    connection(update)

    assign = command(commands, "assign", "assign a worker to an organisation",
                     "Let the worker take the organisation's tasks (repeating it is a no-op).", _assign)
    assign.add_argument("worker_id", metavar="WORKER_ID")
    assign.add_argument("organization_id", metavar="ORG_ID")
    connection(assign)

    unassign = command(
        commands, "unassign", "remove a worker's assignment to an organisation",
        "Remove an assignment: new leases stop; the organisation's active tasks on the worker are cancelled unless "
        "--finish-active.", _unassign)
    unassign.add_argument("worker_id", metavar="WORKER_ID")
    unassign.add_argument("organization_id", metavar="ORG_ID")
    unassign.add_argument("--finish-active", action="store_true", help="let its active tasks finish")
    unassign.add_argument("--reason", help="why (recorded with the cancellations; not with --finish-active)")
    connection(unassign)

    for name, help_, description, func in (
            ("disable", "disable a worker",
             "Disable a worker: refused from its next request on; its active attempts end at once and their tasks "
             "are retried elsewhere.", _disable),
            ("enable", "enable a disabled worker", "Enable a worker again.", _enable)):
        parser = command(commands, name, help_, description, func)
        parser.add_argument("worker_id", metavar="WORKER_ID")
        connection(parser)

    revoke = command(commands, "revoke", "revoke a worker for good",
                     "Revoke a worker for good and cancel its active tasks.", _revoke)
    revoke.add_argument("worker_id", metavar="WORKER_ID")
    revoke.add_argument("--reason", help="why (recorded with the events)")
    connection(revoke)


def _capacities(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task-type", action="append", metavar="TYPE", help="a task type it runs (repeat for more)")
    parser.add_argument("--capability", action="append", metavar="NAME", help="a capability it has (repeat for more)")
    parser.add_argument("--max-concurrent", type=int, metavar="N", help="tasks it may run at once")


def worker_line(worker: Any) -> str:
    state = "revoked" if worker.revoked_at else "enabled" if worker.enabled else "disabled"
    text = (f"{worker.id}  {worker.name:<20} {state:<8} {worker.liveness:<4}"
            f"  last poll {when(worker.last_poll_at)}  last seen {when(worker.last_seen_at)}"
            f"  leases {len(worker.live_leases)}/{worker.max_concurrent_tasks}"
            f"  types {','.join(worker.task_types) or '-'}")
    return text + "".join(f"\n  warning: {w}" for w in worker.warnings)


def _detail(worker: Any) -> str:
    assignments = "".join(f"\n  assigned to {a.organization_id}  {a.state}" for a in worker.assignments)
    return (f"{worker_line(worker)}\n  fingerprint {worker.fingerprint}"
            f"  capabilities {','.join(worker.capabilities) or '-'}{assignments}")


def fingerprint(path: Path) -> str:
    """SHA-256 of the first certificate of a PEM file (lowercase hex), as the Gateway computes it."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"cannot read the certificate {path}: {exc}", EXIT_USAGE) from exc
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    if begin not in text or end not in text:
        raise CommandError(f"{path} holds no PEM certificate", EXIT_USAGE)
    pem = text[text.index(begin):text.index(end) + len(end)] + "\n"
    try:
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()
    except ValueError as exc:
        raise CommandError(f"{path}: not a valid PEM certificate: {exc}", EXIT_USAGE) from exc


def _list(args: argparse.Namespace) -> int:
    for worker in run(args, lambda api: every(api.iter_workers(liveness=args.liveness))):
        show(args, worker, worker_line(worker))
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    worker = run(args, lambda api: api.get_worker(args.worker_id))
    show(args, worker, _detail(worker))
    return EXIT_OK


def _register(args: argparse.Namespace) -> int:
    print_ = args.fingerprint.lower() if args.fingerprint else fingerprint(args.cert)

    async def register_and_assign(api: Any) -> Any:
        worker = await api.register_worker(args.name, print_, task_types=args.task_type,
                                           capabilities=args.capability, max_concurrent_tasks=args.max_concurrent)
        for organization in args.organization:
            worker = await api.assign_worker(worker.id, organization)
        return worker

    worker = run(args, register_and_assign)
    show(args, worker, _detail(worker))
    return EXIT_OK


def _update(args: argparse.Namespace) -> int:
    if args.task_type is None and args.capability is None and args.max_concurrent is None:
        raise CommandError("nothing to change: give --task-type, --capability or --max-concurrent", EXIT_USAGE)
    worker = run(args, lambda api: api.update_worker(args.worker_id, task_types=args.task_type,
                                                     capabilities=args.capability,
                                                     max_concurrent_tasks=args.max_concurrent))
    show(args, worker, _detail(worker))
    return EXIT_OK


def _assign(args: argparse.Namespace) -> int:
    worker = run(args, lambda api: api.assign_worker(args.worker_id, args.organization_id))
    show(args, worker, _detail(worker))
    return EXIT_OK


def _revocation(args: argparse.Namespace, revocation: Any) -> None:
    show(args, revocation, _detail(revocation.worker)
         + "".join(f"\n  cancelled task {t}" for t in revocation.cancelled_task_ids))


def _unassign(args: argparse.Namespace) -> int:
    if args.finish_active:
        if args.reason:
            raise CommandError("--reason goes with cancellations; --finish-active cancels nothing", EXIT_USAGE)
        revocation = run(args, lambda api: api.unassign_worker(args.worker_id, args.organization_id,
                                                               finish_active=True))
    else:
        revocation = run(args, lambda api: api.revoke_assignment(args.worker_id, args.organization_id,
                                                                 reason=args.reason))
    _revocation(args, revocation)
    return EXIT_OK


def _disable(args: argparse.Namespace) -> int:
    worker = run(args, lambda api: api.disable_worker(args.worker_id))
    show(args, worker, _detail(worker))
    return EXIT_OK


def _enable(args: argparse.Namespace) -> int:
    worker = run(args, lambda api: api.enable_worker(args.worker_id))
    show(args, worker, _detail(worker))
    return EXIT_OK


def _revoke(args: argparse.Namespace) -> int:
    _revocation(args, run(args, lambda api: api.revoke_worker(args.worker_id, reason=args.reason)))
    return EXIT_OK
