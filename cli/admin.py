"""``leasehold admin``: administration without a running Gateway, straight on the database.

``create-key`` issues an operator API key. ``fair-share`` shows or sets an organisation's
fair-share weight and cap of live attempts (as ``PUT /v1/organizations/{id}/fair-share`` does
for an administrator key), printing the organisation's fair-share state as JSON.

``create-key``:
The key is printed once, alone on stdout (``KEY=$(leasehold admin create-key …)``); its id and
scope go to stderr. Only its sha256 is stored. Without ``--organization`` it is an
administrator key. The database is ``--database-url``, else ``$LEASEHOLD_DATABASE_URL``, else
``$DATABASE_URL``, else the embedded server (as for ``leasehold gateway serve``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from uuid import UUID

from cli.embedded import configured_database_url
from cli.main import EXIT_OK, EXIT_USAGE, CommandError
from domain.errors import LeaseholdError
from gateway.commands.registry import FairShareState, IssuedKey
from gateway.services import build_services
from persistence.connection import create_pool
from persistence.transaction import Database

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``admin`` command group (``create-key``) to the ``leasehold`` CLI."""
    admin = subparsers.add_parser("admin", help="operator administration (API keys, fair shares)",
                                  description="Administer the operator API and the organisations' fair shares.")
    commands = admin.add_subparsers(dest="admin_command", metavar="COMMAND", required=True)
    create = commands.add_parser(
        "create-key", help="create an operator API key and print it once",
        description="Create an operator API key: of one organisation (--organization), else an "
                    "administrator key. The key is printed once on stdout; only its sha256 is stored.")
    create.add_argument("--organization", metavar="ORG_ID", help="organisation id (default: administrator key)")
    create.add_argument("--name", default=None, help="a label for the key (default: derived from the scope)")
    create.add_argument("--database-url", metavar="URL", help="postgresql:// URL (default: as the Gateway)")
    create.set_defaults(func=_create_key)
    share = commands.add_parser(
        "fair-share", help="show or set an organisation's fair-share weight and cap",
        description="Show an organisation's fair-share weight, cap of live attempts and counters (JSON on "
                    "stdout); with --weight, --max-live-attempts or --no-cap, set them first (the options "
                    "not given keep their current values). Recorded as an event of the organisation.")
    share.add_argument("organization", metavar="ORG_ID", help="organisation id")
    share.add_argument("--weight", type=int, metavar="N", help="share relative to the worker's other "
                       "organisations at equal priority, 1-1000 (a new organisation has 1)")
    cap = share.add_mutually_exclusive_group()
    cap.add_argument("--max-live-attempts", type=int, metavar="N",
                     help="most attempts of the organisation live at once across the fleet, 1-1000000")
    cap.add_argument("--no-cap", action="store_true", help="remove the cap of live attempts")
    share.add_argument("--database-url", metavar="URL", help="postgresql:// URL (default: as the Gateway)")
    share.set_defaults(func=_fair_share)


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


def _fair_share(args: argparse.Namespace) -> int:
    try:
        organization = UUID(args.organization)
    except ValueError as exc:
        raise CommandError(f"ORG_ID must be an organisation id (a UUID), not {args.organization!r}",
                           EXIT_USAGE) from exc
    change = args.weight is not None or args.max_live_attempts is not None or args.no_cap
    state = asyncio.run(_share(args.database_url, organization, args.weight, args.max_live_attempts,
                               args.no_cap, change))
    print(json.dumps({"organization_id": str(state.organization_id), "weight": state.weight,
                      "max_live_attempts": state.max_live_attempts, "live_attempts": state.live,
                      "leases_served": state.served, "waited_seconds_total": state.waited_seconds,
                      "virtual_time": state.virtual_time,
                      "updated_at": state.updated_at.isoformat() if state.updated_at else None}, indent=2))
    return EXIT_OK


async def _share(database_url: str | None, organization: UUID, weight: int | None, cap: int | None,
                 no_cap: bool, change: bool) -> FairShareState:
    url = configured_database_url(database_url)
    pool = create_pool(url, min_size=1, max_size=1)
    await pool.open()
    try:
        registry = build_services(Database(pool)).registry
        state = await registry.fair_share(organization)
        if state is None:
            raise CommandError(f"no such organisation {organization}")
        if change:
            state = await registry.set_fair_share(
                organization, weight=state.weight if weight is None else weight,
                max_live_attempts=None if no_cap else (state.max_live_attempts if cap is None else cap),
                actor="system")
        return state
    except LeaseholdError as exc:
        raise CommandError(exc.message) from exc
    finally:
        await pool.close()
