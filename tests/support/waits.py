"""Waiting in tests: poll a condition until it holds, or fail saying what never happened.

A test never sleeps to let something settle. It waits for a signal the code already gives — a
metric (``leasehold_long_polls_waiting``), a notifier counter, an event or a row in the database,
a log line, a file a plugin writes — with :func:`wait_until`, which returns as soon as the
condition holds (fast on a quiet machine) and waits up to ``timeout`` on a loaded one (never
flaky). Synchronous code (a fixture, a thread) uses :func:`wait_until_sync`, the same loop.

A sleep that is itself what a test exercises (a plugin that runs for a while, a lease left to
expire, a client that renews every 0.3 s) stays a sleep, with a comment saying so.

Failure reads ``timed out after 10s waiting for <what> (last: <value>)``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["DEFAULT_TIMEOUT", "wait_until", "wait_until_sync"]

T = TypeVar("T")

#: Seconds a wait lasts unless told: long enough for a loaded 2-core box, never reached when the
#: code works (the wait ends when the condition holds).
DEFAULT_TIMEOUT = 15.0
#: Seconds between two looks at the condition.
DEFAULT_INTERVAL = 0.02


def _timed_out(timeout: float, what: str, last: object) -> AssertionError:
    return AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


async def wait_until(condition: Callable[[], T | Awaitable[T]],
                     timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 (a failed wait is a test failure, not a cancellation)
                     *, what: str, interval: float = DEFAULT_INTERVAL) -> T:
    """Call ``condition`` (a plain or an async function) until it returns something truthy, and
    return that; raise :class:`AssertionError` naming ``what`` after ``timeout`` seconds.

    The condition is looked at once more after the deadline, so a slow last look still counts."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what, value)
        await asyncio.sleep(interval)


def wait_until_sync(condition: Callable[[], T], timeout: float = DEFAULT_TIMEOUT, *,
                    what: str, interval: float = DEFAULT_INTERVAL) -> T:
    """:func:`wait_until` for code without an event loop (fixtures, threads, plugin scripts' hosts)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what, value)
        time.sleep(interval)
