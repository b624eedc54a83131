"""``leasehold admin create-key``: issue an operator API key without a running Gateway.
``leasehold admin target-policy``: show or replace an organisation's target policy.

The key is printed once, alone on stdout (``KEY=$(leasehold admin create-key …)``); its id and
scope go to stderr. Only its sha256 is stored. Without ``--organization`` it is an
administrator key. The database is ``--database-url``, else ``$LEASEHOLD_DATABASE_URL``, else
``$DATABASE_URL``, else the embedded server (as for ``leasehold gateway serve``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from uuid import UUID

from cli.embedded import configured_database_url
from cli.main import EXIT_OK, EXIT_USAGE, CommandError
from domain.errors import LeaseholdError
from domain.targets import DEFAULT_DENIED_DOMAINS, DEFAULT_DENIED_NETWORKS, TargetPolicy, parse_policy
from gateway.commands.registry import IssuedKey
from gateway.services import build_services
from persistence.connection import create_pool
from persistence.transaction import Database

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``admin`` command group (``create-key``, ``target-policy``) to the ``leasehold`` CLI."""
    admin = subparsers.add_parser("admin", help="operator administration (API keys, target policies)",
                                  description="Administer the operator API.")
    commands = admin.add_subparsers(dest="admin_command", metavar="COMMAND", required=True)
    create = commands.add_parser(
        "create-key", help="create an operator API key and print it once",
        description="Create an operator API key: of one organisation (--organization), else an "
                    "administrator key. The key is printed once on stdout; only its sha256 is stored.")
    create.add_argument("--organization", metavar="ORG_ID", help="organisation id (default: administrator key)")
    create.add_argument("--name", default=None, help="a label for the key (default: derived from the scope)")
    create.add_argument("--database-url", metavar="URL", help="postgresql:// URL (default: as the Gateway)")
    create.set_defaults(func=_create_key)
    policy = commands.add_parser(
        "target-policy", help="show or replace an organisation's target policy",
        description="Show an organisation's target policy (which scan targets it may aim workers at), or "
                    "replace it with --allow/--deny entries (networks, addresses or domains). Loopback, "
                    "link-local and cloud metadata addresses are denied unless an --allow entry inside them "
                    "opens them; --allow entries outside those restrict targets to the list. --clear "
                    "restores the default policy.")
    policy.add_argument("organization", metavar="ORG_ID", help="organisation id")
    policy.add_argument("--allow", action="append", default=[], metavar="ENTRY",
                        help="an allowed network, address or domain (repeatable)")
    policy.add_argument("--deny", action="append", default=[], metavar="ENTRY",
                        help="a denied network, address or domain (repeatable)")
    policy.add_argument("--clear", action="store_true", help="restore the default policy (no entries)")
    policy.add_argument("--database-url", metavar="URL", help="postgresql:// URL (default: as the Gateway)")
    policy.set_defaults(func=_target_policy)


def _create_key(args: argparse.Namespace) -> int:
    organization: UUID | None = None
    if args.organization is not None:
        try:
            organization = UUID(args.organization)
        except ValueError as exc:
            raise CommandError(f"--organization must be an organisation id (a UUID), not {args.organization!r}",
                               EXIT_USAGE) from exc
    name = args.name or (f"organisation {organization}" if organization else "administrator")
    issued = asyncio.run(_issue(args.database_url, organization, name))
    scope = f"organisation {issued.organization_id}" if issued.organization_id else "administrator"
    print(f"created API key {issued.id} ({scope}, name {issued.name!r}); it is shown only once:",
          file=sys.stderr)
    print(issued.key)
    return EXIT_OK


async def _issue(database_url: str | None, organization: UUID | None, name: str) -> IssuedKey:
    url = configured_database_url(database_url)
    pool = create_pool(url, min_size=1, max_size=1)
    await pool.open()
    try:
        return await build_services(Database(pool)).registry.create_api_key(organization_id=organization, name=name)
    except LeaseholdError as exc:
        raise CommandError(exc.message) from exc
    finally:
        await pool.close()


def _target_policy(args: argparse.Namespace) -> int:
    try:
        organization = UUID(args.organization)
    except ValueError as exc:
        raise CommandError(f"ORG_ID must be an organisation id (a UUID), not {args.organization!r}",
                           EXIT_USAGE) from exc
    if args.clear and (args.allow or args.deny):
        raise CommandError("--clear takes no --allow or --deny", EXIT_USAGE)
    change = args.clear or bool(args.allow or args.deny)
    policy = asyncio.run(_policy(args.database_url, organization, args.allow, args.deny, change))
    print(f"target policy of organisation {organization}{' (replaced)' if change else ''}:")
    print("allow: " + (" ".join(policy.allow) or "(none)"))
    print("deny: " + (" ".join(policy.deny) or "(none)"))
    print("denied by default: " + " ".join([*map(str, DEFAULT_DENIED_NETWORKS), *DEFAULT_DENIED_DOMAINS]))
    return EXIT_OK


async def _policy(database_url: str | None, organization: UUID, allow: list[str], deny: list[str],
                  change: bool) -> TargetPolicy:
    pool = create_pool(configured_database_url(database_url), min_size=1, max_size=1)
    await pool.open()
    try:
        registry = build_services(Database(pool)).registry
        if change:
            await registry.set_target_policy(organization, parse_policy(allow, deny), actor="cli:admin")
        return await registry.target_policy(organization)
    except LeaseholdError as exc:
        raise CommandError(exc.message) from exc
    finally:
        await pool.close()
