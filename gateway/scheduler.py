"""The scan scheduler: a background loop in every Gateway process.

Each pass claims due schedules with ``FOR UPDATE SKIP LOCKED`` in batches (see
:meth:`gateway.commands.schedules.Schedules.claim_due`), so any number of processes and
replicas can run it at once: each due slot yields exactly one scan, committed together with
the schedule's advance.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from domain.errors import LeaseholdError
from gateway.commands.schedules import Schedules

log = logging.getLogger("leasehold.scheduler")


async def schedule_once(schedules: Schedules, *, batch: int = 50) -> int:
    """Claim until fewer than ``batch`` schedules were due; returns how many were handled."""
    handled = 0
    while True:
        n = await schedules.claim_due(limit=batch)
        handled += n
        if n < batch:
            return handled


async def run(schedules: Schedules, interval: float, on_pass: Callable[[int], None] | None = None) -> None:
    """Schedule forever, every ``interval`` seconds; database outages are logged and retried."""
    while True:
        try:
            handled = await schedule_once(schedules)
            if on_pass is not None:
                on_pass(handled)
        except asyncio.CancelledError:
            raise
        except (LeaseholdError, OSError) as exc:
            log.warning("scheduling failed; retrying", extra={"error": str(exc)})
        except Exception:
            log.exception("scheduler crashed; retrying")
        await asyncio.sleep(interval)
