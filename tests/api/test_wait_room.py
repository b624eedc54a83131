"""Waiting costs nothing: parked acquire long-polls do no database work of their own, are woken
only by what concerns them, and the process's one sweep covers a notification that never came.

Real Gateway, real PostgreSQL. The polls are counted by wrapping the Gateway's own
``Lifecycle.poll`` (the acquire's one transaction), the database work by the connection pool's
own request counter.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any
from uuid import UUID

import pytest

from leasehold.gateway.keys import NOTIFIER
from leasehold.gateway.tls import PkiPaths
from support.gateway import RunningGateway, running_gateway
from support.waits import wait_until

#: Far longer than any wait below: only a wake-up can explain a fast answer.
SLOW_POLL = 30.0


@pytest.fixture
async def quiet(database_url: str, pki: PkiPaths) -> AsyncIterator[RunningGateway]:
    """A Gateway whose own background loops stay out of the way of the counts (no lease sweep,
    no sampling, no scheduler, no look for bulk operations during the test), re-polling every second were it to poll, and sweeping for
    missed wake-ups every 0.5 s."""
    async with running_gateway(database_url, pki, sweep_interval_seconds=600, metrics_sample_seconds=600,
                               checkpoint_interval_seconds=0, poll_interval_seconds=1.0,
                               wake_sweep_seconds=0.5, bulk_interval_seconds=600,
                               schedule_interval_seconds=0) as gw:
        yield gw


def count_polls(gw: RunningGateway) -> Counter[UUID]:
    """Polls (acquire transactions) per worker from now on."""
    polls: Counter[UUID] = Counter()
    poll = gw.lifecycle.poll

    async def counted(worker_id: UUID, **kwargs: Any) -> Any:
        polls[worker_id] += 1
        return await poll(worker_id, **kwargs)

    gw.lifecycle.poll = counted  # type: ignore[method-assign]
    return polls


def pool_requests(gw: RunningGateway) -> int:
    """Connections handed out by the Gateway's pool so far (every transaction takes one)."""
    return int(gw.pool.get_stats().get("requests_num", 0))


def drop_topics(gw: RunningGateway, prefix: str) -> Callable[[], None]:
    """Lose every notification whose topic starts with ``prefix`` (as if never delivered)."""
    room = gw.app[NOTIFIER].room
    dispatch = room.dispatch
    room.dispatch = lambda topic: None if topic.startswith(prefix) else dispatch(topic)

    def restore() -> None:
        room.dispatch = dispatch
    return restore


async def test_two_hundred_idle_long_polls_cost_no_transactions_while_they_wait(quiet: RunningGateway) -> None:
    workers = [await quiet.worker() for _ in range(20)]
    polls = count_polls(quiet)
    waits = [asyncio.create_task(w.acquire(wait=20)) for w in workers for _ in range(10)]
    await quiet.long_polls_waiting(at_least=200, within=30)
    # Each long-poll polled once at most (a worker's later ones may find its first one's poll), then parked.
    parked_polls = sum(polls.values())
    assert 20 <= parked_polls <= 200
    before, started = pool_requests(quiet), time.monotonic()
    await asyncio.sleep(3.0)  # the idle period being measured
    used, seconds = pool_requests(quiet) - before, time.monotonic() - started
    # The old loop re-polled each waiter every poll interval: ~600 transactions here. Now only
    # the process's sweep runs (one read every 0.5 s), whatever the number of waiters.
    assert used <= seconds / 0.5 + 2, used
    assert sum(polls.values()) == parked_polls
    quiet.app[NOTIFIER].close()
    assert {(await t).status for t in waits} == {204}


async def test_a_queued_task_wakes_a_waiter_of_its_organisation_only(quiet: RunningGateway) -> None:
    other_org = await quiet.registry.create_organization("other")
    mine, theirs = await quiet.worker(), await quiet.worker(org=other_org)
    polls = count_polls(quiet)
    waiting = [asyncio.create_task(mine.acquire(wait=20)), asyncio.create_task(theirs.acquire(wait=20))]
    await quiet.long_polls_waiting(at_least=2)
    started = time.monotonic()
    task_id = await quiet.task()
    got = await waiting[0]
    assert got.status == 200 and got.body["lease"]["task"]["id"] == str(task_id)
    assert time.monotonic() - started < 1.0
    # The notification named the task's organisation: the other worker's long-poll was never
    # woken, nor by the sweeps that follow (no work for its organisation); over two of them
    # (longer than the 1 s poll interval the old loop re-polled at) it never polled again.
    room = quiet.app[NOTIFIER].room
    swept = room.sweeps
    await wait_until(lambda: room.sweeps >= swept + 3, 10, what="three sweeps")
    assert polls[theirs.id] == 1
    assert not waiting[1].done() and quiet.app[NOTIFIER].waiting == 1
    quiet.app[NOTIFIER].close()
    assert (await waiting[1]).status == 204


async def test_a_task_whose_notification_was_lost_is_found_by_the_sweep(database_url: str, pki: PkiPaths) -> None:
    async with running_gateway(database_url, pki, poll_interval_seconds=SLOW_POLL, wake_sweep_seconds=0.5) as gw:
        worker = await gw.worker()
        drop_topics(gw, "available:")
        waiting = asyncio.create_task(worker.acquire(wait=20))
        await gw.long_polls_waiting()
        started = time.monotonic()
        task_id = await gw.task()
        got = await waiting
        assert got.status == 200 and got.body["lease"]["task"]["id"] == str(task_id)
        assert time.monotonic() - started < 5.0  # a sweep or two, far below the 30 s poll


async def test_a_burst_of_tasks_is_taken_by_a_chain_of_wake_ups_not_a_herd(quiet: RunningGateway) -> None:
    workers = [await quiet.worker(capacity=1) for _ in range(30)]
    room = quiet.app[NOTIFIER].room
    # The notifications of their assignments are in (else they would wake them, and count here).
    await wait_until(lambda: all(str(w.id) in room._worker_seq for w in workers), 10,
                     what="every worker's assignment notified")
    polls = count_polls(quiet)
    waiting = [asyncio.create_task(w.acquire(wait=20)) for w in workers]
    await quiet.long_polls_waiting(at_least=30)
    for _ in range(12):
        await quiet.task()
    leased = await wait_until(lambda: sum(1 for t in waiting if t.done()) >= 12, 15, what="12 leases")
    assert leased
    # One notification per task, each waking at most wake_batch waiters, each lease passing the
    # baton once, and a waiter notified while it polled polling once more: far fewer polls than
    # waking every waiter for every task (30 × 12 = 360).
    woken_polls = sum(polls.values()) - 30
    assert woken_polls <= 12 * 2 * (quiet.settings.wake_batch + 1), woken_polls
    quiet.app[NOTIFIER].close()
    answers = [await t for t in waiting]
    assert sum(1 for a in answers if a.status == 200) == 12


async def test_a_cancel_reaches_a_waiting_worker_and_a_lost_one_is_found_by_the_sweep(
        database_url: str, pki: PkiPaths) -> None:
    async with running_gateway(database_url, pki, poll_interval_seconds=SLOW_POLL, wake_sweep_seconds=0.5) as gw:
        worker = await gw.worker()
        first, second = await gw.task(), await gw.task()
        leases = [(await worker.acquire()).body["lease"] for _ in range(2)]
        by_task = {lease["task"]["id"]: lease for lease in leases}
        # Notified: the waiting long-poll answers at once.
        waiting = asyncio.create_task(worker.acquire(wait=20))
        await gw.long_polls_waiting()
        started = time.monotonic()
        await gw.lifecycle.request_cancel(first)
        got = await waiting
        assert got.status == 200 and time.monotonic() - started < 1.0
        assert got.body["cancel_requested"] == [{"task_id": str(first),
                                                 "attempt_id": by_task[str(first)]["attempt_id"]}]
        # Its notification lost: the sweep still tells the waiting worker.
        drop_topics(gw, "cancel:")
        waiting = asyncio.create_task(worker.acquire(wait=20, known_cancels=[by_task[str(first)]["attempt_id"]]))
        await gw.long_polls_waiting()
        started = time.monotonic()
        await gw.lifecycle.request_cancel(second)
        got = await waiting
        assert got.status == 200 and time.monotonic() - started < 5.0
        assert got.body["cancel_requested"] == [{"task_id": str(second),
                                                 "attempt_id": by_task[str(second)]["attempt_id"]}]


async def test_an_idle_workers_next_long_poll_waits_without_polling_until_something_concerns_it(
        quiet: RunningGateway) -> None:
    worker = await quiet.worker()
    polls = count_polls(quiet)

    async def idle_without_polling() -> bool:
        before = polls[worker.id]
        assert (await worker.acquire(wait=1)).status == 204
        return polls[worker.id] == before

    # Once the notifications of its registration are in, a long-poll finds what the last found
    # without asking the database, again and again.
    await wait_until(idle_without_polling, 15, what="a long-poll that did not poll")
    assert await idle_without_polling()
    # Work queued for it: its next long-poll polls (and leases) at once.
    polled = polls[worker.id]
    await quiet.task()
    assert (await worker.acquire(wait=1)).status == 200
    assert polls[worker.id] == polled + 1
    assert (await worker.acquire(wait=1)).status == 204
    # A worker changed (here disabled) is told on its next request, as before.
    await quiet.registry.set_worker_enabled(worker.id, False)
    await wait_until(lambda: quiet.app[NOTIFIER].room.unchanged(worker.id, []) is None, 5,
                     what="the worker's change notified")
    assert (await worker.acquire(wait=1)).status == 403


async def test_a_lost_listen_connection_wakes_every_waiter_once_when_it_is_back(quiet: RunningGateway) -> None:
    workers = [await quiet.worker() for _ in range(5)]
    notifier = quiet.app[NOTIFIER]
    polls = count_polls(quiet)
    waiting = [asyncio.create_task(w.acquire(wait=25)) for w in workers]
    await quiet.long_polls_waiting(at_least=5)
    reconnects = notifier.reconnects
    await quiet.count("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                      "WHERE datname = current_database() AND query ILIKE 'LISTEN%%'")
    await wait_until(lambda: notifier.reconnects > reconnects, 15, what="the listen connection back")
    await wait_until(lambda: all(polls[w.id] >= 2 for w in workers), 10, what="every waiter re-polled")
    notifier.close()
    assert {(await t).status for t in waiting} == {204}


async def test_a_task_notified_while_the_long_poll_polls_is_not_missed(database_url: str, pki: PkiPaths) -> None:
    # Neither the poll interval nor the sweep can explain a fast answer here.
    async with running_gateway(database_url, pki, poll_interval_seconds=SLOW_POLL,
                               wake_sweep_seconds=SLOW_POLL) as gw:
        worker = await gw.worker()
        notifier = gw.app[NOTIFIER]
        await wait_until(lambda: gw.app[NOTIFIER].room.unchanged(worker.id, []) is None, 5, what="settled")
        poll = gw.lifecycle.poll
        created: list[UUID] = []

        async def racing(worker_id: UUID, **kwargs: Any) -> Any:
            polled = await poll(worker_id, **kwargs)
            if not created:  # the first poll found nothing; a task is queued and notified before it parks
                received = notifier.received
                created.append(await gw.task())
                await wait_until(lambda: notifier.received > received, 5, what="the notification received")
            return polled

        gw.lifecycle.poll = racing  # type: ignore[method-assign]
        started = time.monotonic()
        got = await worker.acquire(wait=20)
        assert got.status == 200 and got.body["lease"]["task"]["id"] == str(created[0])
        assert time.monotonic() - started < 5.0
