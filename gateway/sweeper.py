"""The lease sweeper: a background loop in every Gateway process.

Each pass expires lapsed leases (retry with backoff, or terminal), fails attempts past their
execution deadline (timeout), and ends ``cancelling`` tasks whose worker never acknowledged.
All three lock work with ``FOR UPDATE SKIP LOCKED`` in batches, so any number of processes and
replicas can sweep at once without stepping on each other or on live commands.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from domain.errors import LeaseholdError
from gateway.commands import Lifecycle

log = logging.getLogger("leasehold.sweeper")


async def sweep_once(lifecycle: Lifecycle, *, batch: int = 100) -> int:
    """One full pass; returns how many tasks changed."""
    changed = 0
    for step in (lifecycle.expire_leases, lifecycle.exceed_deadlines, lifecycle.terminate_cancelling):
        while True:
            n = await step(limit=batch)
            changed += n
            if n < batch:
                break
    return changed


async def run(lifecycle: Lifecycle, interval: float, on_pass: Callable[[int], None] | None = None) -> None:
    """Sweep forever, every ``interval`` seconds; database outages are logged and retried."""
    while True:
        try:
            changed = await sweep_once(lifecycle)
            if on_pass is not None:
                on_pass(changed)
        except asyncio.CancelledError:
            raise
        except (LeaseholdError, OSError) as exc:
            log.warning("sweep failed; retrying", extra={"error": str(exc)})
        except Exception:
            log.exception("sweep crashed; retrying")
        await asyncio.sleep(interval)
