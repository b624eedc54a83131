"""``leasehold gateway serve``: the Gateway's settings from flags and the environment, then
:func:`gateway.serve.serve`."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from leasehold.cli.dburl import add_database_options, resolve_database_url
from leasehold.cli.main import EXIT_USAGE, CommandError
from leasehold.gateway.serve import serve
from leasehold.gateway.settings import GatewaySettings

#: Settings that are secrets: read from the environment or a file only, never from a flag (a flag
#: would show the secret to everyone who can list processes).
SECRET_SETTINGS = frozenset({"admin_api_key"})


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in GatewaySettings.model_fields.items():
        if name in SECRET_SETTINGS:
            continue
        flag = "--" + name.replace("_", "-")
        env = f"env LEASEHOLD_{name.upper()}"
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, default=None, action=argparse.BooleanOptionalAction,
                                help=f"{field.description} ({env}; default: --{'' if field.default else 'no-'}"
                                     f"{name.replace('_', '-')})")
            continue
        default = "not set" if field.default is None else f"default {field.default}"
        parser.add_argument(flag, dest=name, default=None, metavar=_metavar(name),
                            help=f"{field.description} ({env}; {default})")


def _metavar(name: str) -> str:
    last = name.rsplit("_", 1)[-1]
    if last in ("seconds", "port", "file", "dir", "url", "host", "level", "size", "bytes"):
        return last.upper()
    if last in ("span", "ahead"):
        return "INTERVAL"
    return "N"


def register(subparsers: Any) -> None:
    gateway = subparsers.add_parser("gateway", help="run the Gateway", description="Run the Gateway.")
    sub = gateway.add_subparsers(dest="gateway_command", metavar="COMMAND", required=True)
    serve_parser = sub.add_parser(
        # No abbreviations: `--admin-api-key VALUE` must be refused, not read as --admin-api-key-file.
        "serve", help="serve the worker and operator APIs over HTTPS", allow_abbrev=False,
        description="Serve the worker API (mTLS) and the operator API (API keys) over HTTPS. Every setting is "
                    "also read from its LEASEHOLD_<NAME> environment variable; flags win. The bootstrap "
                    "administrator key is read only from LEASEHOLD_ADMIN_API_KEY or --admin-api-key-file. "
                    "Start-up failures print one line and exit 1; invalid settings exit 2; SIGTERM stops "
                    "gracefully (see --shutdown-timeout-seconds).")
    _add_settings_flags(serve_parser)
    add_database_options(serve_parser, url=False)
    serve_parser.set_defaults(func=_run)


def settings_error(exc: ValidationError) -> str:
    """A pydantic validation error of the settings as one line: ``--flag: reason; …``."""
    parts = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "settings"
        parts.append(f"--{name.replace('_', '-')} (LEASEHOLD_{name.upper()}): {error['msg']}")
    return "invalid setting: " + "; ".join(parts)


def _run(args: argparse.Namespace) -> int:
    overrides = {name: getattr(args, name) for name in GatewaySettings.model_fields
                 if getattr(args, name, None) is not None}
    try:
        settings = GatewaySettings(**overrides)
    except ValidationError as exc:
        raise CommandError(settings_error(exc), EXIT_USAGE) from exc
    url = resolve_database_url(settings.database_url, embedded=args.embedded)
    return serve(settings.model_copy(update={"database_url": url}))
