"""The operator commands: ``leasehold organizations|keys|workers|scans|tasks|bulk|webhooks|profiles|schedules|counts``.

Every command talks to a running Gateway's operator API with the Python client
(:mod:`leasehold.client`), so it needs neither the database nor the ``server`` extra:

* ``--url`` (or ``LEASEHOLD_OPERATOR_URL``; default ``https://localhost:8444``),
* the API key from ``LEASEHOLD_API_KEY`` or ``--api-key-file FILE`` (never on the command line,
  where ``ps`` would show it),
* ``--ca-file`` (or ``LEASEHOLD_CA_FILE``): the CA of the Gateway's certificate (default: the
  system's trust store).

One module per resource (``base`` holds what they share). Lists print one line per item
(``--json``: one JSON object per line); the cursor-paged ones (scans, tasks) print one page
(``--limit``, at most 500) and ``--all`` follows the cursors to the end, otherwise the next
page's cursor goes to stderr. Exit codes: 0 success, 1 an API error (its status, title and
detail on stderr, with a 422's field errors) or an unreachable Gateway, 2 a usage error.
"""

from __future__ import annotations

from leasehold.cli.operator import bulk, keys, organizations, profiles, scans, tasks, webhooks, workers
from leasehold.cli.operator.base import Subparsers

__all__ = ["register"]


def register(subparsers: Subparsers) -> None:
    """Add the operator commands to the ``leasehold`` CLI, in help order."""
    organizations.register(subparsers)
    keys.register(subparsers)
    workers.register(subparsers)
    scans.register(subparsers)
    tasks.register(subparsers)
    bulk.register(subparsers)
    webhooks.register(subparsers)
    profiles.register(subparsers)  # profiles, schedules
    organizations.register_counts(subparsers)
