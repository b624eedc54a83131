"""Wake-up topics: what a committed command tells waiting long-polls (``Transaction.notify``).

A topic travels as a PostgreSQL NOTIFY payload (and, with Redis configured, as a hint); the
Gateway's :class:`gateway.background.notify.Notifier` wakes the acquires waiting on it.
"""

from __future__ import annotations


def available(organization_id: object) -> str:
    """Work became available to the organisation's workers (a task was created or requeued)."""
    return f"available:{organization_id}"


def cancel(worker_id: object) -> str:
    """One of the worker's running tasks is to be cancelled."""
    return f"cancel:{worker_id}"


def worker(worker_id: object) -> str:
    """The worker was changed (enabled, disabled, revoked, its organisations, task types or
    capacity): its long-poll looks again, and what a Gateway cached about it is forgotten."""
    return f"worker:{worker_id}"
