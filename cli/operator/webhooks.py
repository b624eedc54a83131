"""``leasehold webhooks``: subscribe an organisation's URLs to its notifications (scans that ended,
tasks that failed terminally, cancellations never acknowledged, workers gone), read what was
delivered, redeliver, and send a test ping."""

from __future__ import annotations

import argparse
import sys
from typing import Any, get_args

from leasehold.cli.main import EXIT_OK
from leasehold.cli.operator.base import Subparsers, command, connection, run, show, when
from leasehold.client.models import DeliveryState, WebhookEventType

EVENT_TYPES: tuple[str, ...] = get_args(WebhookEventType)
DELIVERY_STATES: tuple[str, ...] = get_args(DeliveryState)


def register(subparsers: Subparsers) -> None:
    webhooks = subparsers.add_parser(
        "webhooks", help="notifications to an organisation's URLs, signed: subscribe, deliveries, redeliver (operator API)",
        description="Webhook subscriptions through the operator API: `webhooks create URL` (prints the signing "
                    "secret once), `list`, `show`, `delete` (disable), `deliveries` (what was sent, by state), "
                    "`redeliver` and `test`. Each notification is POSTed at least once, signed, with an id "
                    "receivers deduplicate by; failed sends are retried with backoff, then dead-lettered.")
    commands = webhooks.add_subparsers(dest="webhooks_command", metavar="COMMAND", required=True)
    create = command(commands, "create", "subscribe a URL to notifications",
                     "Subscribe URL to the organisation's notifications. Prints the subscription and its signing "
                     "secret (whsec_…): keep the secret, it is never shown again.", _create)
    create.add_argument("endpoint", metavar="URL", help="where notifications are POSTed: an http:// or https:// URL")
    create.add_argument("--organization", metavar="ORG_ID", help="required with an administrator key")
    create.add_argument("--event", dest="event_types", action="append", choices=EVENT_TYPES, metavar="TYPE",
                        help=f"a notification to send (repeat; default every one): {', '.join(EVENT_TYPES)}")
    create.add_argument("--description", help="what the endpoint is")
    connection(create)
    connection(command(commands, "list", "list webhook subscriptions",
                       "List the webhook subscriptions the key can see, newest first.", _list))
    shown = command(commands, "show", "show a webhook subscription", "Show a webhook subscription (never its "
                    "secret).", _show)
    shown.add_argument("webhook_id", metavar="WEBHOOK_ID")
    connection(shown)
    delete = command(commands, "delete", "disable a webhook subscription",
                     "Disable a webhook subscription: nothing more is sent to it, its pending deliveries become "
                     "dead letters.", _delete)
    delete.add_argument("webhook_id", metavar="WEBHOOK_ID")
    connection(delete)
    deliveries = command(commands, "deliveries", "list a subscription's deliveries",
                         "List a subscription's deliveries, newest first.", _deliveries)
    deliveries.add_argument("webhook_id", metavar="WEBHOOK_ID")
    deliveries.add_argument("--state", choices=DELIVERY_STATES, help="only pending, delivered or dead ones")
    deliveries.add_argument("--limit", type=int, default=100, metavar="N", help="at most N, 1..500 (default 100)")
    connection(deliveries)
    redeliver = command(commands, "redeliver", "send a delivery again",
                        "Send a delivery again now (same id), with a fresh budget of attempts.", _redeliver)
    redeliver.add_argument("webhook_id", metavar="WEBHOOK_ID")
    redeliver.add_argument("delivery_id", metavar="DELIVERY_ID")
    connection(redeliver)
    test = command(commands, "test", "send a test ping",
                   "Queue a test ping (type webhook.test) to the subscription; `deliveries` shows how it went.",
                   _test)
    test.add_argument("webhook_id", metavar="WEBHOOK_ID")
    connection(test)


def _line(hook: Any) -> str:
    state = "enabled" if hook.enabled else "disabled"
    return f"{hook.id}  {state:<8} {hook.url}  [{', '.join(hook.event_types)}]  org {hook.organization_id}"


def _delivery_line(d: Any) -> str:
    last = f"  last {d.last_status or '-'} {d.last_error or ''}".rstrip()
    return (f"{d.id}  {d.state:<9} {d.event_type:<24} attempts {d.attempts}  created {when(d.created_at)}"
            f"{last}")


def _create(args: argparse.Namespace) -> int:
    hook = run(args, lambda api: api.create_webhook(args.endpoint, organization_id=args.organization,
                                                    event_types=args.event_types, description=args.description))
    show(args, hook, f"{_line(hook)}\nsecret: {hook.secret}")
    if not args.json:
        print("keep the secret: it signs every delivery and is never shown again", file=sys.stderr)
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    for hook in run(args, lambda api: api.list_webhooks()).items:
        show(args, hook, _line(hook))
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    hook = run(args, lambda api: api.get_webhook(args.webhook_id))
    detail = f"\n  description: {hook.description}" if hook.description else ""
    show(args, hook, f"{_line(hook)}\n  created {when(hook.created_at)} by {hook.created_by}{detail}")
    return EXIT_OK


def _delete(args: argparse.Namespace) -> int:
    hook = run(args, lambda api: api.delete_webhook(args.webhook_id))
    show(args, hook, _line(hook))
    return EXIT_OK


def _deliveries(args: argparse.Namespace) -> int:
    page = run(args, lambda api: api.webhook_deliveries(args.webhook_id, state=args.state, limit=args.limit))
    for delivery in page.items:
        show(args, delivery, _delivery_line(delivery))
    return EXIT_OK


def _redeliver(args: argparse.Namespace) -> int:
    delivery = run(args, lambda api: api.redeliver_webhook(args.webhook_id, args.delivery_id))
    show(args, delivery, _delivery_line(delivery))
    return EXIT_OK


def _test(args: argparse.Namespace) -> int:
    delivery = run(args, lambda api: api.test_webhook(args.webhook_id))
    show(args, delivery, _delivery_line(delivery))
    return EXIT_OK


__all__ = ["register"]
