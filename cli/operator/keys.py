"""``leasehold keys``: operator API keys through the API (administrator): create, list, show,
revoke, rotate. (``leasehold admin`` does the same straight on the database, for the first key.)"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from leasehold.cli.main import EXIT_OK
from leasehold.cli.operator.base import Subparsers, command, connection, every, iso_time, run, show, when


def register(subparsers: Subparsers) -> None:
    keys = subparsers.add_parser(
        "keys", help="create, list, revoke and rotate API keys (operator API, administrator)",
        description="Operator API keys through the operator API of a running Gateway (administrator key). A new key "
                    "is printed once, alone on stdout (KEY=$(leasehold keys create …)); its id and scope go to "
                    "stderr. Only its sha256 is stored.")
    commands = keys.add_subparsers(dest="keys_command", metavar="COMMAND", required=True)

    create = command(commands, "create", "create an API key (printed once)",
                     "Create a key of an organisation (--organization) or an administrator key (without).", _create)
    create.add_argument("--name", required=True, help="the key's name")
    create.add_argument("--organization", metavar="ORG_ID", help="the organisation whose key it is")
    create.add_argument("--expires-at", type=iso_time, metavar="TIME", help="when it stops working (ISO 8601)")
    connection(create)

    listing = command(commands, "list", "list API keys (never the keys)", "List API keys' records.", _list)
    listing.add_argument("--organization", metavar="ORG_ID", help="only this organisation's keys")
    connection(listing)

    shown = command(commands, "show", "show an API key's record", "Show an API key's record.", _show)
    shown.add_argument("key_id", metavar="KEY_ID")
    connection(shown)

    revoke = command(commands, "revoke", "revoke an API key",
                     "Revoke a key: its next request answers 401 (repeating it is a no-op).", _revoke)
    revoke.add_argument("key_id", metavar="KEY_ID")
    connection(revoke)

    rotate = command(commands, "rotate", "rotate an API key (the new key printed once)",
                     "A new key with the same name and scope; the old one revoked in the same transaction.", _rotate)
    rotate.add_argument("key_id", metavar="KEY_ID")
    rotate.add_argument("--expires-at", type=iso_time, metavar="TIME", help="when the new key stops working")
    connection(rotate)


def _line(key: Any) -> str:
    scope = f"org {key.organization_id}" if key.organization_id else "administrator"
    state = f"revoked {when(key.revoked_at)}" if key.revoked_at else f"expires {when(key.expires_at)}"
    return f"{key.id}  {key.name:<20} {scope}  created {when(key.created_at)}  {state}  last used {when(key.last_used_at)}"


def _created(args: argparse.Namespace, created: Any) -> int:
    if args.json:
        print(created.model_dump_json())
        return EXIT_OK
    print(created.key)
    scope = f"organisation {created.organization_id}" if created.organization_id else "administrator"
    print(f"key {created.id} ({created.name}, {scope}); shown once", file=sys.stderr)
    return EXIT_OK


def _create(args: argparse.Namespace) -> int:
    return _created(args, run(args, lambda api: api.create_api_key(args.organization, args.name,
                                                                    expires_at=args.expires_at)))


def _list(args: argparse.Namespace) -> int:
    for key in run(args, lambda api: every(api.iter_api_keys(organization_id=args.organization))):
        show(args, key, _line(key))
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    key = run(args, lambda api: api.get_api_key(args.key_id))
    show(args, key, _line(key))
    return EXIT_OK


def _revoke(args: argparse.Namespace) -> int:
    key = run(args, lambda api: api.revoke_api_key(args.key_id))
    show(args, key, _line(key))
    return EXIT_OK


def _rotate(args: argparse.Namespace) -> int:
    return _created(args, run(args, lambda api: api.rotate_api_key(args.key_id, expires_at=args.expires_at)))
