"""Retry delays: exponential backoff with full jitter.

``delay = uniform(0, min(cap, initial * 2**n))`` for the n-th consecutive failure, as in
"Exponential Backoff And Jitter" (AWS Architecture Blog): many workers that lost the Gateway at
the same moment spread their retries instead of returning in a thundering herd. A small floor
keeps a run of near-zero draws from turning into a busy loop.
"""

from __future__ import annotations

import asyncio
import random

MIN_DELAY_SECONDS = 0.05


class Backoff:
    """Delays for consecutive failures; :meth:`reset` after a success."""

    def __init__(self, initial: float, cap: float, *, rng: random.Random | None = None) -> None:
        self.initial, self.cap = initial, cap
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self, at_least: float = 0.0) -> float:
        """The delay before the next try (``at_least``: e.g. a server's Retry-After)."""
        ceiling = min(self.cap, self.initial * 2 ** min(self.failures, 30))
        self.failures += 1
        return max(MIN_DELAY_SECONDS, at_least, self._rng.uniform(0.0, ceiling))

    def reset(self) -> None:
        self.failures = 0


async def sleep_unless(event: asyncio.Event | None, seconds: float) -> bool:
    """Sleep ``seconds``, or less if ``event`` is set meanwhile; True when it was set."""
    if event is None:
        await asyncio.sleep(seconds)
        return False
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True
