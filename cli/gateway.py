"""``leasehold gateway serve``: the Gateway's settings from flags and the environment, then
:func:`gateway.serve.serve`."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from cli.dburl import add_database_options, resolve_database_url
from cli.main import EXIT_USAGE, CommandError
from gateway.serve import serve
from gateway.settings import GatewaySettings


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in GatewaySettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, default=None,
                            help=f"{field.description} (env LEASEHOLD_{name.upper()}; default {field.default!r})")


def register(subparsers: Any) -> None:
    gateway = subparsers.add_parser("gateway", help="run the Gateway")
    sub = gateway.add_subparsers(dest="gateway_command", metavar="COMMAND", required=True)
    serve_parser = sub.add_parser("serve", help="serve the worker and operator APIs over HTTPS")
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
