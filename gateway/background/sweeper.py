"""The lease sweeper: a background loop in every Gateway process.

Each pass expires lapsed leases (retry with backoff, or terminal), fails attempts past their
execution deadline (timeout), and ends ``cancelling`` tasks whose worker never acknowledged;
then it lowers the queued-work flags of organisations whose queue emptied (migration 0021).
All three lock work with ``FOR UPDATE SKIP LOCKED`` in batches, so any number of processes and
replicas can sweep at once without stepping on each other or on live commands.
"""

from __future__ import annotations

from collections.abc import Callable

from leasehold.gateway.background.loops import every
from leasehold.gateway.commands.lifecycle import Lifecycle


async def sweep_once(lifecycle: Lifecycle, *, batch: int = 100) -> int:
    """One full pass; returns how many tasks changed."""
    changed = 0
    for step in (lifecycle.expire_leases, lifecycle.exceed_deadlines, lifecycle.terminate_cancelling):
        while True:
            n = await step(limit=batch)
            changed += n
            if n < batch:
                break
    await lifecycle.clear_queue_flags()
    return changed


async def run(lifecycle: Lifecycle, interval: float, on_pass: Callable[[int], None] | None = None) -> None:
    """Run :func:`sweep_once` every ``interval`` seconds, forever (see :func:`gateway.background.loops.every`)."""
    await every(interval, lambda: sweep_once(lifecycle), name="sweeper", on_pass=on_pass)
