"""The scan scheduler: a background loop in every Gateway process.

Each pass claims due schedules with ``FOR UPDATE SKIP LOCKED`` in batches (see
:meth:`gateway.commands.schedules.Schedules.claim_due`), so any number of processes and
replicas can run it at once: each due slot yields exactly one scan, committed together with
the schedule's advance. A schedule whose scan cannot be created is rolled back alone (its own
savepoint), logged and backed off by this process; the rest of the batch goes on.
"""

from __future__ import annotations

from collections.abc import Callable

from leasehold.gateway.background.loops import every
from leasehold.gateway.commands.schedules import Schedules


async def schedule_once(schedules: Schedules, *, batch: int = 50) -> int:
    """Claim until fewer than ``batch`` schedules were due; returns how many were handled."""
    handled = 0
    while True:
        n = await schedules.claim_due(limit=batch)
        handled += n
        if n < batch:
            return handled


async def run(schedules: Schedules, interval: float, on_pass: Callable[[int], None] | None = None) -> None:
    """Run :func:`schedule_once` every ``interval`` seconds, forever (see :func:`gateway.background.loops.every`)."""
    await every(interval, lambda: schedule_once(schedules), name="scheduler", on_pass=on_pass)
