"""A cancellation's delivery on the record (``CancelDelivered``) and a disabled worker's attempts
ended at once (``AttemptRevoked``), against a real PostgreSQL: once per cancellation however many
answers carry it, also when renewals and acquire answers race; and the log rebuilds the rows."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

from leasehold.persistence.event_log import read_stream
from support.core import World, assert_log_rebuilds_live


async def kinds(world: World, task_id: UUID) -> list[str]:
    async with world.pool.connection() as conn:
        return [type(e).__name__ for e in await read_stream(conn, task_id)]


async def delivery_row(world: World, task_id: UUID) -> tuple[Any, ...]:
    async with world.pool.connection() as conn:
        cur = await conn.execute("SELECT cancel_delivered_at IS NOT NULL, cancel_delivery_channel, "
                                 "cancel_acknowledged_at IS NOT NULL FROM worker_tasks WHERE id = %s", (task_id,))
        row = await cur.fetchone()
    assert row is not None
    return tuple(row)


async def test_the_first_renewal_answer_records_the_delivery_and_later_answers_do_not(
        world: World, database_url: str) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    args = (worker, a.task.id, a.attempt.id, a.lease_token)
    assert (await world.lifecycle.renew(*args)).cancel_requested is False
    await world.lifecycle.request_cancel(a.task.id)
    for _ in range(3):
        assert (await world.lifecycle.renew(*args)).cancel_requested is True
    polled = await world.lifecycle.poll(worker)
    assert polled.cancel_requested == [(a.task.id, a.attempt.id)] and polled.undelivered == frozenset()
    await world.lifecycle.cancels_delivered(worker, polled.cancel_requested, channel="long-poll", actor="w")
    await world.lifecycle.acknowledge_cancel(*args)
    assert await kinds(world, a.task.id) == ["TaskCreated", "TaskLeased", "TaskStarted", "LeaseRenewed",
                                             "CancelRequested", "CancelDelivered", "TaskCancelled"]
    assert await delivery_row(world, a.task.id) == (True, "renew", True)
    await assert_log_rebuilds_live(database_url)


async def test_an_acquire_answer_records_the_delivery_once_and_then_marks_it_delivered(
        world: World, database_url: str) -> None:
    worker = await world.worker(capacity=2)
    a = await world.running(worker)
    await world.lifecycle.request_cancel(a.task.id)
    polled = await world.lifecycle.poll(worker)
    assert polled.undelivered == frozenset({a.attempt.id})
    await world.lifecycle.cancels_delivered(worker, polled.cancel_requested, channel="long-poll", actor="w")
    again = await world.lifecycle.poll(worker)
    assert again.cancel_requested == [(a.task.id, a.attempt.id)] and again.undelivered == frozenset()
    await world.lifecycle.cancels_delivered(worker, again.cancel_requested, channel="long-poll", actor="w")
    await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
    assert (await kinds(world, a.task.id)).count("CancelDelivered") == 1
    assert await delivery_row(world, a.task.id) == (True, "long-poll", False)
    await assert_log_rebuilds_live(database_url)


async def test_racing_renewals_and_acquire_answers_record_one_delivery(world: World, database_url: str) -> None:
    worker = await world.worker(capacity=8)
    leases = [await world.running(worker) for _ in range(4)]
    for a in leases:
        await world.lifecycle.request_cancel(a.task.id)

    async def renew(a: Any) -> None:
        await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)

    async def deliver_on_poll(a: Any) -> None:
        await world.lifecycle.cancels_delivered(worker, [(a.task.id, a.attempt.id)], channel="long-poll",
                                                actor="w")

    await asyncio.gather(*(step(a) for a in leases for step in (renew, deliver_on_poll) for _ in range(5)))
    for a in leases:
        assert (await kinds(world, a.task.id)).count("CancelDelivered") == 1
        delivered, channel, _ = await delivery_row(world, a.task.id)
        assert delivered and channel in ("renew", "long-poll")
    await assert_log_rebuilds_live(database_url)


async def test_disabling_ends_the_workers_attempts_at_once_and_frees_their_tasks(
        world: World, database_url: str) -> None:
    worker, other = await world.worker(capacity=4), await world.worker(capacity=4)
    running = await world.running(worker)
    leased = await world.leased(worker)
    cancelling = await world.running(worker)
    await world.lifecycle.request_cancel(cancelling.task.id)
    elsewhere = await world.running(other)
    await world.registry.set_worker_enabled(worker, False)
    ended = await world.lifecycle.cancel_worker_attempts(worker, reason="worker disabled", actor="op", at_once=True)
    assert sorted(ended) == sorted([running.task.id, leased.task.id, cancelling.task.id])
    assert await world.lifecycle.cancel_worker_attempts(worker, reason="again", actor="op", at_once=True) == []
    for a in (running, leased):
        assert (await kinds(world, a.task.id))[-1] == "AttemptRevoked"
    assert (await kinds(world, cancelling.task.id))[-1] == "TaskCancelled"
    assert (await kinds(world, elsewhere.task.id))[-1] == "TaskStarted"  # another worker's: untouched
    # Free for another worker at once (no backoff), and the disabled worker's writes are refused.
    await world.registry.set_worker_enabled(worker, True)
    again = [await world.lifecycle.acquire(other) for _ in range(2)]
    assert sorted(g.task.id for g in again if g is not None) == sorted([running.task.id, leased.task.id])
    await assert_log_rebuilds_live(database_url)
