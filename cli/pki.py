"""``leasehold pki …`` commands: create the Gateway's CA and issue worker certificates.

``register(subparsers)`` adds the ``pki`` command group to the ``leasehold`` CLI; each leaf
parser sets ``func`` (``Callable[[argparse.Namespace], int]``) as its default, so the CLI runs
``args.func(args)`` and exits with the returned code. ``main(argv)`` runs the group on its own:
``python -m leasehold.cli.pki init DIR``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from leasehold.cli.dev_ca import DEFAULT_SERVER_NAMES, init_pki, issue_worker_certificate
from leasehold.gateway.tls import PkiError

__all__ = ["add_pki_commands", "main", "register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``pki`` command group (``init``, ``issue-worker``) to a CLI's subparsers."""
    parser = subparsers.add_parser(
        "pki",
        help="manage the Gateway's mTLS certificate authority",
        description="Create the Gateway's certificate authority and issue worker certificates.",
    )
    add_pki_commands(parser)
    return parser


def add_pki_commands(parser: argparse.ArgumentParser) -> None:
    """Add the ``init`` and ``issue-worker`` subcommands to ``parser``."""
    commands = parser.add_subparsers(dest="pki_command", metavar="COMMAND", required=True)

    init = commands.add_parser(
        "init",
        help="create a CA and the Gateway's server certificate",
        description="Create ca.pem, ca-key.pem, server.pem and server-key.pem in DIR. "
        "An existing CA is kept unless --force is given.",
    )
    init.add_argument("directory", metavar="DIR", type=Path, help="PKI directory (created if missing)")
    init.add_argument("--force", action="store_true", help="replace an existing CA and server certificate")
    init.add_argument(
        "--server-name",
        dest="server_names",
        action="append",
        metavar="NAME",
        help="DNS name or IP address for the server certificate (repeatable; default: "
        f"{', '.join(DEFAULT_SERVER_NAMES)})",
    )
    init.add_argument(
        "--days", type=int, default=825, help="validity of the server certificate (default: 825)"
    )
    init.set_defaults(func=_run_init)

    issue = commands.add_parser(
        "issue-worker",
        help="issue a worker's client certificate",
        description="Write DIR/workers/NAME.pem and NAME-key.pem, signed by the CA in DIR, and "
        "print the certificate's SHA-256 fingerprint on the last line.",
    )
    issue.add_argument("directory", metavar="DIR", type=Path, help="PKI directory made by 'pki init'")
    issue.add_argument("name", metavar="NAME", help="worker name (letters, digits, '.', '_', '-')")
    issue.add_argument("--days", type=int, default=365, help="validity in days (default: 365)")
    issue.add_argument("--force", action="store_true", help="replace an existing certificate of that name")
    issue.set_defaults(func=_run_issue_worker)


def _run_init(args: argparse.Namespace) -> int:
    try:
        paths = init_pki(
            args.directory,
            server_names=args.server_names or DEFAULT_SERVER_NAMES,
            days=args.days,
            force=args.force,
        )
    except PkiError as exc:
        print(f"leasehold pki init: {exc}", file=sys.stderr)
        return 1
    print(f"ca certificate:     {paths.ca_cert}")
    print(f"ca key:             {paths.ca_key}")
    print(f"server certificate: {paths.server_cert}")
    print(f"server key:         {paths.server_key}")
    return 0


def _run_issue_worker(args: argparse.Namespace) -> int:
    try:
        issued = issue_worker_certificate(args.directory, args.name, days=args.days, force=args.force)
    except PkiError as exc:
        print(f"leasehold pki issue-worker: {exc}", file=sys.stderr)
        return 1
    print(f"certificate: {issued.cert_path}")
    print(f"key:         {issued.key_path}")
    print(f"not after:   {issued.not_after.isoformat()}")
    # Last line, alone: the fingerprint to register the worker with (scripts take `tail -n1`).
    print(issued.fingerprint)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run a ``pki`` subcommand, e.g. ``main(["issue-worker", "pki", "w1"])``; return its exit code."""
    parser = argparse.ArgumentParser(prog="leasehold pki", description=register.__doc__)
    add_pki_commands(parser)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
