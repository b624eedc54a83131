"""``leasehold seal …``: the key that signs seals, and a seal on demand.

    leasehold seal keygen DIR
    leasehold seal now [--signing-key KEY] [--digest-dir DIR] [--database-url URL] [--json]

``keygen`` writes ``DIR/seal-key.pem`` (private, mode 0600: give it to the Gateway as
``LEASEHOLD_SEAL_KEY_FILE``) and ``DIR/seal-public.pem`` (give it to the auditors). ``now`` writes a
checkpoint, signs it and appends it to the digest sink, like the Gateway's seal loop;
``--signing-key`` and ``--digest-dir`` default to ``$LEASEHOLD_SEAL_KEY_FILE`` and
``$LEASEHOLD_DIGEST_DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

import orjson

from leasehold.cli.dburl import add_database_options, check_migrated, resolve_database_url
from leasehold.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from leasehold.persistence.connection import connect
from leasehold.persistence.seals import Sealer, SealKeyError, generate_keypair, load_private_key, open_sink

__all__ = ["register"]

PRIVATE_NAME = "seal-key.pem"
PUBLIC_NAME = "seal-public.pem"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``leasehold seal`` and its actions."""
    seal = subparsers.add_parser(
        "seal", help="signed seals of the event log: the signing key, a seal on demand",
        description="Signed seals: checkpoints signed with an Ed25519 key the database never sees, appended "
                    "to a digest sink outside PostgreSQL (see the docs: Audit, 'Signed seals').")
    actions = seal.add_subparsers(dest="seal_command", metavar="ACTION", required=True)
    p = actions.add_parser("keygen", help="create a seal key pair in DIR (seal-key.pem, seal-public.pem)")
    p.add_argument("dir", type=Path, metavar="DIR", help="directory to write the two files to (created if needed)")
    p.set_defaults(func=_keygen)
    p = actions.add_parser("now", help="write a checkpoint, sign it and append it to the digest sink")
    p.add_argument("--signing-key", type=Path, metavar="KEY",
                   help="seal private key (default: $LEASEHOLD_SEAL_KEY_FILE)")
    p.add_argument("--digest-dir", type=Path, metavar="DIR", help="digest sink (default: $LEASEHOLD_DIGEST_DIR)")
    add_database_options(p)
    p.add_argument("--json", action="store_true", help="print the published record as JSON")
    p.set_defaults(func=_now)


def _keygen(args: argparse.Namespace) -> int:
    args.dir.mkdir(parents=True, exist_ok=True)
    try:
        kid = generate_keypair(args.dir / PRIVATE_NAME, args.dir / PUBLIC_NAME)
    except FileExistsError as exc:
        raise CommandError(str(exc)) from exc
    print(f"seal key {kid}: private {args.dir / PRIVATE_NAME} (the Gateway's LEASEHOLD_SEAL_KEY_FILE; keep it off"
          f" the database host), public {args.dir / PUBLIC_NAME} (for verify-chain --public-key)")
    return EXIT_OK


def _setting(value: Path | None, env: str, flag: str) -> Path:
    if value is not None:
        return value
    if os.environ.get(env):
        return Path(os.environ[env])
    raise CommandError(f"give {flag} or set ${env}", EXIT_USAGE)


def _now(args: argparse.Namespace) -> int:
    key_path = _setting(args.signing_key, "LEASEHOLD_SEAL_KEY_FILE", "--signing-key")
    sink_path = _setting(args.digest_dir, "LEASEHOLD_DIGEST_DIR", "--digest-dir")
    try:
        sealer = Sealer(load_private_key(key_path), open_sink(sink_path))
    except SealKeyError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    url = resolve_database_url(args.database_url, embedded=args.embedded)
    check_migrated(url)
    record = asyncio.run(_seal(url, sealer))
    if args.json:
        print(orjson.dumps(record, option=orjson.OPT_INDENT_2).decode())
    else:
        print(f"seal of checkpoint {record['checkpoint_id']} at {record['created_at']}: {record['head_count']}"
              f" streams, {record['event_count']} events ({len(record['changed'])} heads changed), appended to"
              f" {sink_path}\nseal {record['seal']}")
    return EXIT_OK


async def _seal(url: str, sealer: Sealer) -> dict[str, Any]:
    async with await connect(url, application_name="leasehold-seal") as conn:
        return await sealer.seal(conn)
