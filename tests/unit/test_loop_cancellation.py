"""A background loop stops when cancelled, even when the cancellation surfaces from a database
call as that call's error (the driver abandoning its pipeline): stopping the Gateway waits for
its loops, so one that logged the error and went on would keep the process alive for ever."""

from __future__ import annotations

import asyncio

from leasehold.domain.errors import Unavailable
from leasehold.gateway.background.loops import every


async def test_a_cancellation_turned_into_an_error_still_stops_the_loop() -> None:
    started = asyncio.Event()
    passes = 0

    async def step() -> int:
        nonlocal passes
        passes += 1
        started.set()
        try:
            await asyncio.sleep(60)  # a pass that is still running when the loop is cancelled
        except asyncio.CancelledError:
            raise Unavailable("the database is unavailable") from None  # what the driver raised instead
        return 0

    loop = asyncio.create_task(every(0.001, step, name="test"))
    await started.wait()
    loop.cancel()
    done, _ = await asyncio.wait({loop}, timeout=5)
    assert done == {loop} and loop.cancelled()
    assert passes == 1
