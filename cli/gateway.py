"""``leasehold gateway serve``: the Gateway's settings from flags and the environment, then
:func:`gateway.serve.serve`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cli.embedded import configured_database_url
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
    serve_parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    overrides = {name: getattr(args, name) for name in GatewaySettings.model_fields
                 if getattr(args, name, None) is not None}
    try:
        settings = GatewaySettings(**overrides)
    except Exception as exc:
        print(f"leasehold: error: {exc}", file=sys.stderr)
        return 2
    if settings.database_url is None:
        settings = settings.model_copy(update={"database_url": configured_database_url()})
    return serve(settings)
