"""``leasehold admin create-key``: issue an operator API key without a running Gateway.

The key is printed once, alone on stdout (``KEY=$(leasehold admin create-key …)``); its id and
scope go to stderr. Only its sha256 is stored. Without ``--organization`` it is an
administrator key. The database is ``--database-url``, else ``$LEASEHOLD_DATABASE_URL``, else
``$DATABASE_URL`` (``--embedded``: the embedded development server), as for every command.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from uuid import UUID

from cli.dburl import add_database_options, check_reachable, resolve_database_url
from cli.main import EXIT_OK, EXIT_USAGE, CommandError
from domain.errors import LeaseholdError
from gateway.commands.registry import IssuedKey
from gateway.services import build_services
from persistence.connection import create_pool
from persistence.transaction import Database

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``admin`` command group (``create-key``) to the ``leasehold`` CLI."""
    admin = subparsers.add_parser("admin", help="operator administration (API keys)",
                                  description="Administer the operator API.")
    commands = admin.add_subparsers(dest="admin_command", metavar="COMMAND", required=True)
    create = commands.add_parser(
        "create-key", help="create an operator API key and print it once",
        description="Create an operator API key: of one organisation (--organization), else an "
                    "administrator key. The key is printed once on stdout; only its sha256 is stored.")
    create.add_argument("--organization", metavar="ORG_ID", help="organisation id (default: administrator key)")
    create.add_argument("--name", default=None, help="a label for the key (default: derived from the scope)")
    add_database_options(create)
    create.set_defaults(func=_create_key)


def _create_key(args: argparse.Namespace) -> int:
    organization: UUID | None = None
    if args.organization is not None:
        try:
            organization = UUID(args.organization)
        except ValueError as exc:
            raise CommandError(f"--organization must be an organisation id (a UUID), not {args.organization!r}",
                               EXIT_USAGE) from exc
    name = args.name or (f"organisation {organization}" if organization else "administrator")
    url = resolve_database_url(args.database_url, embedded=args.embedded)
    check_reachable(url)
    issued = asyncio.run(_issue(url, organization, name))
    scope = f"organisation {issued.organization_id}" if issued.organization_id else "administrator"
    print(f"created API key {issued.id} ({scope}, name {issued.name!r}); it is shown only once:",
          file=sys.stderr)
    print(issued.key)
    return EXIT_OK


async def _issue(url: str, organization: UUID | None, name: str) -> IssuedKey:
    pool = create_pool(url, min_size=1, max_size=1)
    await pool.open()
    try:
        return await build_services(Database(pool)).registry.create_api_key(organization_id=organization, name=name)
    except LeaseholdError as exc:
        raise CommandError(exc.message) from exc
    finally:
        await pool.close()
