"""The bulk operations' runner: each Gateway process reaches the tasks of running bulk operations
(:meth:`gateway.commands.bulk.BulkOperations.run_once`), one operation batch at a time, as long as
there is work; then it waits for an operation this process starts, or ``interval`` seconds (an
operation another process started and could not finish: its hold has to run out first)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import timedelta

from leasehold.gateway.commands.bulk import BulkOperations

log = logging.getLogger("leasehold.gateway")


async def run(bulk: BulkOperations, interval: float, batch: int, *, hold: float = 60.0,
              on_pass: Callable[[int], None] | None = None) -> None:
    """Forever: batches while there is work, else wait for a start here or ``interval``. An
    operation is held ``hold`` seconds a batch (another process carries it on after that)."""
    while True:
        try:
            reached = await bulk.run_once(batch=batch, hold=timedelta(seconds=hold))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("bulk operation batch failed; retried at the next pass")
            reached = 0
        if on_pass is not None:
            on_pass(reached)
        if reached:
            continue
        bulk.started.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(bulk.started.wait(), interval)
