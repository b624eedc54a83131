"""The bulk operations' runner on PostgreSQL, without a Gateway: a stopped operation reaches no
further task, two runners racing over one operation reach each task once, and the operation's
counts equal its task rows."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from leasehold.gateway.commands.bulk import TaskFilter
from support.core import World
from support.waits import wait_until


async def value(world: World, query: str, *params: object) -> object:
    async with world.services.db.pool.connection() as conn:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
    assert row is not None
    return row[0] if len(row) == 1 else tuple(row)


async def outcome_rows(world: World, operation: object) -> object:
    return await value(world, "SELECT count(*) FROM bulk_operation_tasks WHERE operation_id = %s", operation)


async def state(world: World, task: object) -> object:
    return await value(world, "SELECT state FROM worker_tasks WHERE id = %s", task)


async def test_a_stopped_operation_reaches_no_further_task(world: World) -> None:
    tasks = [await world.task() for _ in range(5)]
    bulk = world.services.bulk
    operation = await bulk.start("cancel", TaskFilter(scan_id=world.scan), reason="stop me", actor="test",
                                 organization_id=world.org)
    await bulk.stop(operation)
    assert await bulk.run_once() == 0  # claims nothing: the operation no longer runs
    for task in tasks:
        assert (await state(world, task)) == "pending"
    assert await outcome_rows(world, operation) == 0


async def test_two_runners_racing_reach_each_task_once_and_count_it_once(world: World) -> None:
    tasks = [await world.task() for _ in range(150)]
    bulk = world.services.bulk
    operation = await bulk.start("cancel", TaskFilter(scan_id=world.scan), reason="race", actor="test",
                                 organization_id=world.org)
    # A hold already over (the test clock does not move): while the first runner works through the
    # operation, the second takes it too, once the first has reached a task.
    hold = timedelta(seconds=-1)
    first = asyncio.create_task(bulk.run_once(batch=len(tasks), hold=hold))
    await wait_until(lambda: outcome_rows(world, operation), what="the first runner's first task")
    second = 0
    while not second and not first.done():  # a claim skips the row while a task's transaction counts on it
        second = await bulk.run_once(batch=len(tasks), hold=hold)
    assert second > 0 and await first > 0, second  # both runners reached tasks of the one operation
    while await bulk.run_once(hold=hold):
        pass
    assert await outcome_rows(world, operation) == len(tasks)
    assert await value(world, "SELECT status, total, done, skipped, failed FROM bulk_operations WHERE id = %s",
                       operation) == ("finished", 150, 150, 0, 0)
    assert await value(world, "SELECT count(*) FROM events WHERE topic LIKE %s", "%TaskCancelled") == 150
    for task in tasks:
        assert (await state(world, task)) == "cancelled"
