"""``support.waits``: the one way a test waits. It returns as soon as the condition holds, takes a
plain or an async condition, and a wait that runs out says what never happened."""

from __future__ import annotations

import asyncio
import time

import pytest

from support.waits import wait_until, wait_until_sync


async def test_returns_the_first_truthy_value_of_a_plain_or_an_async_condition() -> None:
    seen = iter([0, None, "", "ready"])
    assert await wait_until(lambda: next(seen), 5, what="the third look", interval=0) == "ready"

    async def later() -> int:
        await asyncio.sleep(0)
        return 7

    assert await wait_until(later, 5, what="an async condition") == 7


async def test_a_wait_that_runs_out_names_what_it_waited_for_and_the_last_value() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"timed out after 0.1s waiting for the plugin to exit \(last: \[\]\)"):
        await wait_until(lambda: [], 0.1, what="the plugin to exit")
    assert time.monotonic() - started < 2


async def test_a_condition_that_fails_ends_the_wait_with_its_own_error() -> None:
    def broken() -> bool:
        raise ValueError("no such row")

    with pytest.raises(ValueError, match="no such row"):
        await wait_until(broken, 5, what="a row")


def test_the_synchronous_twin_behaves_alike() -> None:
    seen = iter([False, False, True])
    assert wait_until_sync(lambda: next(seen), 5, what="the third look", interval=0) is True
    with pytest.raises(AssertionError, match=r"waiting for the replica \(last: 0\)"):
        wait_until_sync(lambda: 0, 0.05, what="the replica")
