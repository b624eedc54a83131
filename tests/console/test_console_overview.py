"""The overview's last hour: completed and failed attempts per 5 minutes (the throughput chart
and its table), lease expiries and rejected writes, matching the database, bounded by time, and
only the key's organisation; and the log position a time bisects to."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import psycopg

from leasehold.domain.retry import RetryPolicy
from leasehold.gateway.console import pages
from leasehold.persistence.queries import QUERIES
from support.console import signed_in, wait_for_state
from support.gateway import RunningGateway, tenant

WRONG = "wrong-token-" + "x" * 30


def buckets(text: str) -> list[tuple[int, int]]:
    chart = text.split('<svg id="throughput-chart"')[1].split("</svg>")[0]
    return [(int(done), int(bad)) for done, bad in
            re.findall(r'<g class="bucket" data-start="[^"]+" data-completed="(\d+)" data-failed="(\d+)"', chart)]


async def test_the_last_hour_matches_the_database_and_the_key(gateway: RunningGateway) -> None:
    gateway.lifecycle.retry_policy = RetryPolicy(base_seconds=30, cap_seconds=30)
    worker = await gateway.worker(capacity=10)
    completed = [await gateway.task() for _ in range(3)]
    failed = await gateway.task()
    expiring = await gateway.task(lease_seconds=1)
    old = await gateway.task()
    leases = {}
    for _ in range(6):
        lease = (await worker.acquire()).body["lease"]
        leases[UUID(lease["task"]["id"])] = lease
    for task_id in [*completed, old]:
        assert (await worker.final_batch(leases[task_id])).status == 200
        assert (await worker.write(leases[task_id], "complete")).status == 200
    assert (await worker.write(leases[failed], "fail", error="boom", retryable=False)).status == 200
    assert (await worker.write({**leases[failed], "lease_token": WRONG}, "renew")).status == 409  # a rejection
    await wait_for_state(gateway, expiring, ("retry_wait",))
    # One completion from before the window: as if its worker was last seen two hours ago.
    async with gateway.pool.connection() as conn:
        await conn.execute("UPDATE worker_task_attempts SET finished_at = now() - interval '2 hours', "
                           "last_seen_at = now() - interval '2 hours' WHERE task_id = %s", (old,))
    browser = await signed_in(gateway)

    page = await browser.get("/console")
    assert page.status == 200 and 'role="img"' in page.text.split('<svg id="throughput-chart"')[1][:40]
    shown = buckets(page.text)
    assert len(shown) == 12 and sum(d for d, _ in shown) == 3 and sum(b for _, b in shown) == 1
    assert shown[-1] == (3, 1)  # all in the newest bucket
    ((done, bad, expiries, rejected),) = page.rows("The last hour, in sum")
    assert (done, bad, expiries, rejected) == ("3", "1", "1", "1")
    table = page.rows("Per 5 minutes")
    assert [(int(r[1]), int(r[2])) for r in table] == shown
    async with gateway.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FILTER (WHERE status = 'succeeded' AND finished_at > now() - "
                                 "interval '1 hour'), count(*) FILTER (WHERE status = 'expired') "
                                 "FROM worker_task_attempts")
        assert await cur.fetchone() == (3, 1)
        cur = await conn.execute("SELECT count(*) FROM events WHERE topic LIKE '%WriteRejected'")
        assert await cur.fetchone() == (1,)

    # Another organisation's key sees none of it.
    _, key = await tenant(gateway, "other")
    outsider = await signed_in(gateway, key)
    page = await outsider.get("/console")
    assert buckets(page.text) == [(0, 0)] * 12
    assert page.rows("The last hour, in sum") == [["0", "0", "0", "0"]]


async def test_rejections_past_the_cap_are_shown_as_a_floor(gateway: RunningGateway, monkeypatch) -> None:
    worker = await gateway.worker()
    await gateway.task()
    lease = (await worker.acquire()).body["lease"]
    for _ in range(3):
        assert (await worker.write({**lease, "lease_token": WRONG}, "renew")).status == 409
    monkeypatch.setattr(pages, "REJECTION_SCAN_CAP", 2)  # the newest two events are rejections
    page = await (await signed_in(gateway)).get("/console")
    assert page.rows("The last hour, in sum")[0][3] == "at least 2"


def test_a_time_bisects_to_the_first_event_recorded_from_then(database_url: str) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute(QUERIES["events_position_at"], {"at": t0}).fetchone() == (None,)  # an empty log
        # 300 events a minute apart, with gaps in notification_id (as rolled-back inserts leave).
        for n in range(300):
            conn.execute("INSERT INTO events (originator_id, originator_version, topic, state, notification_id, "
                         "recorded_at, prev_hash, hash) VALUES (%s, 1, 't', '\\x7b7d', %s, %s, %s, %s)",
                         (uuid4(), 10 + n * 3, t0 + timedelta(minutes=n), b"\0" * 32, b"\0" * 32))
        for at in [t0 - timedelta(days=1), t0, t0 + timedelta(seconds=30), t0 + timedelta(minutes=150),
                   t0 + timedelta(minutes=299), t0 + timedelta(minutes=299, seconds=1), t0 + timedelta(days=1)]:
            (found,) = conn.execute(QUERIES["events_position_at"], {"at": at}).fetchone() or (None,)
            # From the position on are exactly the events recorded from then on.
            (same,) = conn.execute("SELECT bool_and((notification_id >= %s) = (recorded_at >= %s)) FROM events",
                                   (found, at)).fetchone() or (None,)
            assert same is True, (at, found)
        assert found == 10 + 299 * 3 + 1  # past the end: max + 1, so nothing is read
