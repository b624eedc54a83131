"""``leasehold admin …``: administration without a running Gateway, straight on the database:
operator API keys, an organisation's target policy, and its fair share.

    leasehold admin create-key [--organization ORG_ID] [--name NAME] [--expires-at TIME]
    leasehold admin list-keys [--organization ORG_ID] [--json]
    leasehold admin revoke-key KEY_ID
    leasehold admin rotate-key KEY_ID [--expires-at TIME]
    leasehold admin target-policy ORG_ID [--allow ENTRY]… [--deny ENTRY]… [--clear]
    leasehold admin fair-share ORG_ID [--weight N] [--max-live-attempts N | --no-cap]

``fair-share`` shows or sets an organisation's fair-share weight and cap of live attempts (as
``PUT /v1/organizations/{id}/fair-share`` does for an administrator key), printing the
organisation's fair-share state as JSON.

A new key (create, rotate) is printed once, alone on stdout (``KEY=$(leasehold admin create-key
…)``); its id and scope go to stderr. Only its sha256 is stored. Without ``--organization`` it is
an administrator key. The database is ``--database-url``, else ``$LEASEHOLD_DATABASE_URL``, else
``$DATABASE_URL`` (``--embedded``: the embedded development server), as for every command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import orjson

from leasehold.cli.arguments import iso_time
from leasehold.cli.dburl import add_database_options, check_migrated, resolve_database_url
from leasehold.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from leasehold.domain.errors import LeaseholdError
from leasehold.domain.targets import (
    DEFAULT_DENIED_DOMAINS,
    DEFAULT_DENIED_NETWORKS,
    TargetPolicy,
    parse_policy,
)
from leasehold.gateway.commands.registry import FairShareState, IssuedKey, Registry
from leasehold.gateway.services import build_services
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database

__all__ = ["register"]

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``admin`` command group (API keys, target policies, fair shares) to the ``leasehold`` CLI."""
    admin = subparsers.add_parser("admin", help="operator administration (API keys, target policies, fair shares)",
                                  description="Administer the operator API and the organisations' fair shares.")
    commands = admin.add_subparsers(dest="admin_command", metavar="COMMAND", required=True)
    create = commands.add_parser(
        "create-key", help="create an operator API key and print it once",
        description="Create an operator API key: of one organisation (--organization), else an "
                    "administrator key. The key is printed once on stdout; only its sha256 is stored.")
    create.add_argument("--organization", metavar="ORG_ID", help="organisation id (default: administrator key)")
    create.add_argument("--name", default=None, help="a label for the key (default: derived from the scope)")
    create.add_argument("--expires-at", type=iso_time, metavar="TIME",
                        help="when the key stops working (ISO 8601, UTC without an offset; default: never)")
    add_database_options(create)
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
    add_database_options(policy)
    policy.set_defaults(func=_target_policy)

    listing = commands.add_parser("list-keys", help="list the API keys (never the keys themselves)")
    listing.add_argument("--organization", metavar="ORG_ID", help="only this organisation's keys")
    listing.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    add_database_options(listing)
    listing.set_defaults(func=_list_keys)

    revoke = commands.add_parser("revoke-key", help="revoke an API key (its next request answers 401)")
    revoke.add_argument("key_id", metavar="KEY_ID")
    add_database_options(revoke)
    revoke.set_defaults(func=_revoke_key)

    rotate = commands.add_parser("rotate-key",
                                 help="replace an API key by a new one (same name and scope) and print it once")
    rotate.add_argument("key_id", metavar="KEY_ID")
    rotate.add_argument("--expires-at", type=iso_time, metavar="TIME", help="when the new key stops working")
    add_database_options(rotate)
    rotate.set_defaults(func=_rotate_key)


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
    add_database_options(share)
    share.set_defaults(func=_fair_share)


def _uuid(text: str, what: str) -> UUID:
    try:
        return UUID(text)
    except ValueError as exc:
        raise CommandError(f"{what} must be a UUID, not {text!r}", EXIT_USAGE) from exc


def _organization(args: argparse.Namespace) -> UUID | None:
    if args.organization is None:
        return None
    return _uuid(args.organization, "--organization (an organisation id)")


def _create_key(args: argparse.Namespace) -> int:
    organization = _organization(args)
    name = args.name or (f"organisation {organization}" if organization else "administrator")
    issued = asyncio.run(_with_registry(_database(args), lambda r: r.create_api_key(
        organization_id=organization, name=name, expires_at=args.expires_at)))
    _print_issued("created", issued)
    return EXIT_OK


def _print_issued(verb: str, issued: IssuedKey) -> None:
    scope = f"organisation {issued.organization_id}" if issued.organization_id else "administrator"
    expiry = f", expires {issued.expires_at.isoformat()}" if issued.expires_at else ""
    print(f"{verb} API key {issued.id} ({scope}, name {issued.name!r}{expiry}); it is shown only once:",
          file=sys.stderr)
    print(issued.key)


def _list_keys(args: argparse.Namespace) -> int:
    organization = _organization(args)

    async def page(registry: Registry) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        after = None
        while batch := await registry.api_keys(organization_id=organization, after=after, limit=500):
            out += batch
            after = batch[-1][0]
        return out

    columns = ("id", "name", "organization_id", "created_at", "expires_at", "revoked_at", "last_used_at",
               "bootstrap", "replaced_by")
    for row in asyncio.run(_with_registry(_database(args), page)):
        values = {c: (v.isoformat() if isinstance(v, datetime) else str(v) if isinstance(v, UUID) else v)
                  for c, v in zip(columns, row, strict=True)}
        if args.json:
            print(orjson.dumps(values).decode())
        else:
            state = "revoked" if values["revoked_at"] else "active"
            print(f"{values['id']}  {state:7}  {values['organization_id'] or 'administrator'}  {values['name']!r}"
                  f"  last used {values['last_used_at'] or 'never'}"
                  f"{'  expires ' + values['expires_at'] if values['expires_at'] else ''}")
    return EXIT_OK


def _revoke_key(args: argparse.Namespace) -> int:
    key_id = _uuid(args.key_id, "KEY_ID")
    asyncio.run(_with_registry(_database(args), lambda r: r.revoke_api_key(key_id)))
    print(f"revoked API key {key_id}", file=sys.stderr)
    return EXIT_OK


def _rotate_key(args: argparse.Namespace) -> int:
    key_id = _uuid(args.key_id, "KEY_ID")
    issued = asyncio.run(_with_registry(_database(args), lambda r: r.rotate_api_key(
        key_id, expires_at=args.expires_at)))
    _print_issued(f"revoked {key_id}; its replacement is", issued)
    return EXIT_OK


def _database(args: argparse.Namespace) -> str:
    """The database this command works on (the one setting of every command), checked reachable."""
    url = resolve_database_url(args.database_url, embedded=args.embedded)
    check_migrated(url)
    return url


async def _with_registry(url: str, action: Callable[[Registry], Awaitable[T]]) -> T:
    pool = create_pool(url, min_size=1, max_size=1)
    await pool.open()
    try:
        return await action(build_services(Database(pool)).registry)
    except LeaseholdError as exc:
        raise CommandError(exc.message) from exc
    finally:
        await pool.close()


def _target_policy(args: argparse.Namespace) -> int:
    organization = _uuid(args.organization, "ORG_ID (an organisation id)")
    if args.clear and (args.allow or args.deny):
        raise CommandError("--clear takes no --allow or --deny", EXIT_USAGE)
    change = args.clear or bool(args.allow or args.deny)

    async def policy_of(registry: Registry) -> TargetPolicy:
        if change:
            await registry.set_target_policy(organization, parse_policy(args.allow, args.deny), actor="cli:admin")
        return await registry.target_policy(organization)

    policy = asyncio.run(_with_registry(_database(args), policy_of))
    print(f"target policy of organisation {organization}{' (replaced)' if change else ''}:")
    print("allow: " + (" ".join(policy.allow) or "(none)"))
    print("deny: " + (" ".join(policy.deny) or "(none)"))
    print("denied by default: " + " ".join([*map(str, DEFAULT_DENIED_NETWORKS), *DEFAULT_DENIED_DOMAINS]))
    return EXIT_OK


def _fair_share(args: argparse.Namespace) -> int:
    organization = _uuid(args.organization, "ORG_ID (an organisation id)")
    change = args.weight is not None or args.max_live_attempts is not None or args.no_cap

    async def share_of(registry: Registry) -> FairShareState:
        state = await registry.fair_share(organization)
        if state is None:
            raise CommandError(f"no such organisation {organization}")
        if change:
            cap = args.max_live_attempts
            state = await registry.set_fair_share(
                organization, weight=state.weight if args.weight is None else args.weight,
                max_live_attempts=None if args.no_cap else (state.max_live_attempts if cap is None else cap),
                actor="cli:admin")
        return state

    state = asyncio.run(_with_registry(_database(args), share_of))
    print(json.dumps({"organization_id": str(state.organization_id), "weight": state.weight,
                      "max_live_attempts": state.max_live_attempts, "live_attempts": state.live,
                      "leases_served": state.served, "waited_seconds_total": state.waited_seconds,
                      "virtual_time": state.virtual_time,
                      "updated_at": state.updated_at.isoformat() if state.updated_at else None}, indent=2))
    return EXIT_OK
