"""The webhook outbox on PostgreSQL, without a Gateway: a notification is queued in the
transaction of the change it reports (none when that rolls back), once per enabled subscription
of the organisation that wants its type; a gone worker is reported once however many processes
notice it at the same moment; racing senders take disjoint rows, and a sender's claim comes due
again once its lease has passed, its late outcome then ignored."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any
from uuid import UUID

from leasehold.gateway.commands.webhooks import Outcome, notify
from support.core import World


async def rows(world: World, query: str, *params: object) -> list[tuple[Any, ...]]:
    async with world.pool.connection() as conn:
        cur = await conn.execute(query, params)
        return list(await cur.fetchall())


async def subscribe(world: World, *types: str, org: UUID | None = None) -> UUID:
    subscription, secret = await world.services.webhooks.create(
        org or world.org, "http://127.0.0.1:9/hook", event_types=list(types), description=None, actor="test")
    assert secret.startswith("whsec_")
    return subscription


async def queued(world: World, subscription: UUID) -> list[tuple[str, dict[str, Any]]]:
    found = await rows(world, "SELECT event_type, payload FROM webhook_deliveries WHERE subscription_id = %s "
                              "ORDER BY event_type", subscription)
    return [(r[0], r[1]) for r in found]  # not a row of the code under test: the test's own tuples


async def test_a_terminal_failure_notifies_each_subscription_that_wants_it_once(world: World) -> None:
    everything = await subscribe(world)
    scans_only = await subscribe(world, "scan.failed")
    disabled = await subscribe(world)
    await world.services.webhooks.disable(disabled)
    other_org = await world.registry.create_organization("elsewhere")
    elsewhere = await subscribe(world, org=other_org)

    worker = await world.worker()
    a = await world.running(worker, max_attempts=1)
    await world.lifecycle.fail(worker, a.task.id, a.attempt.id, a.lease_token, error="plugin crashed",
                               retryable=False)

    (scan_failed, task_failed) = await queued(world, everything)
    assert scan_failed == ("scan.failed", {"scan_id": str(world.scan), "status": "failed"})
    assert task_failed == ("task.failed", {"task_id": str(a.task.id), "scan_id": str(world.scan),
                                           "task_type": "probe", "attempts": 1, "error": "plugin crashed"})
    assert await queued(world, scans_only) == [scan_failed]
    assert await queued(world, disabled) == [] and await queued(world, elsewhere) == []


async def test_a_cancellation_never_acknowledged_is_reported_as_stuck(world: World) -> None:
    subscription = await subscribe(world, "task.cancellation_stuck")
    worker = await world.worker()
    a = await world.running(worker)
    await world.lifecycle.request_cancel(a.task.id, reason="operator")
    assert await world.lifecycle.terminate_cancelling() == 0  # within the grace: not stuck yet
    assert await queued(world, subscription) == []
    world.clock.advance(31)
    assert await world.lifecycle.terminate_cancelling() == 1
    ((kind, data),) = await queued(world, subscription)
    assert kind == "task.cancellation_stuck" and data["task_id"] == str(a.task.id)


async def test_a_notification_exists_only_if_its_transaction_commits(world: World) -> None:
    subscription = await subscribe(world, "scan.finished")
    async with world.services.db.transaction() as tx:
        notify(tx, world.org, "scan.finished", {"scan_id": "rolled back"}, None)
        await tx.execute("clock_now", {"now": None})  # sent to the server, then rolled back (no commit)
    assert await queued(world, subscription) == []
    async with world.services.db.transaction() as tx:
        notify(tx, world.org, "scan.finished", {"scan_id": "committed"}, None)
        await tx.commit()
    assert await queued(world, subscription) == [("scan.finished", {"scan_id": "committed"})]


async def seen(world: World, worker: UUID, seconds_ago: float) -> None:
    await rows(world, """
        INSERT INTO worker_presence (worker_id, last_poll_at, published_at) VALUES (%s, %s, %s)
        ON CONFLICT (worker_id) DO UPDATE SET last_poll_at = excluded.last_poll_at RETURNING worker_id""",
               worker, world.clock.now - timedelta(seconds=seconds_ago), world.clock.now)


async def test_racing_processes_report_each_absence_of_a_worker_once(world: World) -> None:
    subscription = await subscribe(world, "worker.gone")
    webhooks = world.services.webhooks
    idle = timedelta(seconds=300)
    worker, revoked = await world.worker(), await world.worker()
    await world.registry.revoke_worker(revoked, reason="decommissioned")
    await seen(world, revoked, 1000)  # revoked: meant to be gone, never reported
    await seen(world, worker, 100)
    assert sum(await asyncio.gather(*(webhooks.notice_gone_workers(idle) for _ in range(4)))) == 0  # idle only
    for absence in range(1, 4):
        await seen(world, worker, 1000)  # gone (again, after it came back)
        noticed = await asyncio.gather(*(webhooks.notice_gone_workers(idle) for _ in range(4)))
        assert sorted(noticed) == [0, 0, 0, 1]  # four processes at once: one report
        assert await webhooks.notice_gone_workers(idle) == 0  # and never again for this absence
        assert len(await queued(world, subscription)) == absence
        world.clock.advance(600)
    kinds = {kind for kind, _ in await queued(world, subscription)}
    assert kinds == {"worker.gone"}
    (_, data), *_ = await queued(world, subscription)
    assert data["worker_id"] == str(worker) and data["gone_after_seconds"] == 300


async def test_racing_senders_take_disjoint_rows_and_a_lapsed_claim_is_taken_again(world: World) -> None:
    subscription = await subscribe(world, "scan.finished")
    webhooks = world.services.webhooks
    for n in range(15):
        async with world.services.db.transaction() as tx:
            notify(tx, world.org, "scan.finished", {"n": n}, world.clock())
            await tx.commit()
    lease = timedelta(seconds=10)
    first, second, third = await asyncio.gather(*(webhooks.claim(limit=6, lease=lease) for _ in range(3)))
    ids = [d.id for d in (*first, *second, *third)]
    assert len(ids) == len(set(ids)) == 15  # each row taken by one sender
    assert await webhooks.claim(limit=50, lease=lease) == []  # all claimed: nothing due
    world.clock.advance(11)  # the senders died: their claims lapse
    again = await webhooks.claim(limit=50, lease=lease)
    assert sorted(d.id for d in again) == sorted(ids) and {d.claims for d in again} == {2}
    await webhooks.record([Outcome(first[0], 200), Outcome(first[1], 500, "late")],
                          max_attempts=1)  # the dead senders' late outcomes: ignored
    states = await rows(world, "SELECT count(*) FILTER (WHERE delivered_at IS NULL AND dead_lettered_at IS NULL) "
                               "FROM webhook_deliveries WHERE subscription_id = %s", subscription)
    assert states == [(15,)]
    mine = next(d for d in again if d.id == first[0].id)
    await webhooks.record([Outcome(mine, 204)], max_attempts=1)
    assert await rows(world, "SELECT last_status FROM webhook_deliveries WHERE id = %s", mine.id) == [(204,)]


async def test_a_legacy_executed_scan_reported_failed_notifies_once(world: World) -> None:
    subscription = await subscribe(world, "scan.failed", "scan.finished")
    scan = await world.scans.create_scan(world.org, {"targets": ["127.0.0.1"]}, execution_mode="legacy")
    legacy = world.services.legacy
    await legacy.record_status(scan, "running")
    assert await queued(world, subscription) == []
    await legacy.record_status(scan, "failed")
    await legacy.record_status(scan, "failed")  # a repeat changes nothing, notifies nothing
    assert await queued(world, subscription) == [("scan.failed", {"scan_id": str(scan), "status": "failed"})]


async def test_a_disabled_subscription_is_sent_nothing_more(world: World) -> None:
    subscription = await subscribe(world, "scan.finished")
    webhooks = world.services.webhooks
    async with world.services.db.transaction() as tx:
        notify(tx, world.org, "scan.finished", {"n": 1}, world.clock())
        await tx.commit()
    await webhooks.disable(subscription)
    # A row queued by a transaction that still saw the subscription enabled (it raced the disable).
    await rows(world, "INSERT INTO webhook_deliveries (id, subscription_id, organization_id, event_type, payload, "
                      "created_at, next_attempt_at) VALUES (gen_random_uuid(), %s, %s, 'scan.finished', '{}', %s, %s) "
                      "RETURNING id", subscription, world.org, world.clock.now, world.clock.now)
    assert await webhooks.claim(limit=10, lease=timedelta(seconds=10)) == []
    states = await rows(world, "SELECT dead_lettered_at IS NOT NULL, last_error FROM webhook_deliveries "
                               "WHERE subscription_id = %s ORDER BY created_at, dead_lettered_at NULLS LAST",
                        subscription)
    assert sorted(states, key=str) == sorted([(True, "the subscription was disabled"), (False, None)], key=str)


async def test_a_sender_without_an_enabled_subscription_reads_only_whether_one_exists(world: World) -> None:
    """An idle Gateway's webhook sender runs no statement but a look, every ``recheck`` seconds, for
    an enabled subscription; one created through another process is seen at the next look, one
    created through this process at once."""
    from leasehold.gateway.commands.webhooks import Webhooks

    here = Webhooks(world.services.db)
    elsewhere = Webhooks(world.services.db)  # another Gateway process
    assert await here.subscribed(recheck=3600) is False
    subscription, _ = await elsewhere.create(world.org, "http://127.0.0.1:9/hook", event_types=None,
                                             description=None, actor="test")
    assert await here.subscribed(recheck=3600) is False  # not looked again yet
    assert await here.subscribed(recheck=0) is True  # the next look sees it
    assert await elsewhere.subscribed(recheck=3600) is True  # created here: known at once
    await elsewhere.disable(subscription)
    assert await here.subscribed(recheck=0) is False
