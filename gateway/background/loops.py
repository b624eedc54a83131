"""Background loops of a Gateway process: run a step every interval, forever, surviving outages."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from leasehold.domain.errors import LeaseholdError

log = logging.getLogger("leasehold.loops")


async def every(interval: float, step: Callable[[], Awaitable[int]], *, name: str,
                on_pass: Callable[[int], None] | None = None) -> None:
    """Run ``step`` every ``interval`` seconds until cancelled. A failing pass (the database
    went away, a conflict) is logged and the next pass runs as usual."""
    while True:
        try:
            result = await step()
            if on_pass is not None:
                on_pass(result)
        except asyncio.CancelledError:
            raise
        except (LeaseholdError, OSError) as exc:
            stop_if_cancelled(exc)
            log.warning("%s pass failed; retrying", name, extra={"loop": name, "error": str(exc)})
        except Exception as exc:
            stop_if_cancelled(exc)
            log.exception("%s pass crashed; retrying", name, extra={"loop": name})
        await asyncio.sleep(interval)


def stop_if_cancelled(exc: BaseException) -> None:
    """Raise ``CancelledError`` when this task is being cancelled. A cancellation that lands
    inside a database call can come out as that call's error instead (the driver's pipeline
    reports the connection it had to abandon); a loop that logged it and went on would never
    stop, and the Gateway's shutdown would wait for it forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc
