"""Worker presence through a real Gateway: a worker that only polls stays ``live`` and its last
poll moves, at the cost of one statement per publish interval (not one per poll); a worker that
stops turns ``idle``, then ``gone``; the API, its filter, the CLI and the console say so; a
Gateway that stops publishes what it held."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from test_finding_work import rebuilt_equals_live
from test_operator_api import assert_problem, make_tenant

from leasehold.gateway.keys import METRICS
from leasehold.gateway.services import Services
from leasehold.gateway.tls import PkiPaths
from leasehold.persistence.presence import publish
from support.console import signed_in
from support.gateway import GatewayProcess, RunningGateway, WorkerClient, running_gateway
from support.waits import wait_until

#: Short windows, so that a test sees every state within seconds.
SHORT = {"presence_publish_seconds": 0.25, "worker_live_seconds": 1.5, "worker_idle_seconds": 3.0}


@pytest.fixture
async def quick(database_url: str, pki: PkiPaths) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, pki, **SHORT) as gw:
        yield gw


async def shown(gateway: RunningGateway, worker_id: UUID, **kw: Any) -> dict[str, Any]:
    reply = await gateway.operator("GET", f"/v1/workers/{worker_id}", **kw)
    assert reply.status == 200, reply.body
    return dict(reply.body)


async def listed(gateway: RunningGateway, liveness: str) -> set[str]:
    reply = await gateway.operator("GET", f"/v1/workers?liveness={liveness}")
    assert reply.status == 200, reply.body
    return {w["id"] for w in reply.body["items"]}


async def count_presence_writes(gateway: RunningGateway) -> None:
    """Record every transaction that writes ``worker_presence`` (statement-level triggers; an
    upsert fires both) in ``presence_writes``: what the Gateway sends, not what it says it sends."""
    async with gateway.pool.connection() as conn:
        await conn.execute("""
            CREATE TABLE presence_writes (xid xid8 PRIMARY KEY);
            CREATE FUNCTION record_presence_write() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS
            $$ BEGIN INSERT INTO presence_writes VALUES (pg_current_xact_id()) ON CONFLICT DO NOTHING;
                     RETURN NULL; END $$;
            CREATE TRIGGER record_presence_write AFTER INSERT OR UPDATE ON worker_presence
            FOR EACH STATEMENT EXECUTE FUNCTION record_presence_write();""")


async def keep_polling(worker: WorkerClient, polls: list[float]) -> None:
    while True:
        reply = await worker.acquire()
        assert reply.status == 204, reply.body
        polls.append(time.monotonic())


async def test_a_worker_that_only_polls_stays_live_with_one_statement_per_interval_not_per_poll(
        quick: RunningGateway) -> None:
    """One worker polls without pause and ten wait in long-polls: all eleven live, one statement
    per publish interval for all of them."""
    await count_presence_writes(quick)
    worker = await quick.worker()
    waiters = [await quick.worker() for _ in range(10)]  # and ten more, each parked in a long-poll
    assert (await shown(quick, worker.id))["liveness"] == "gone"  # never seen
    polls: list[float] = []
    started = time.monotonic()
    polling = asyncio.create_task(keep_polling(worker, polls))
    parked = [asyncio.create_task(w.acquire(wait=30)) for w in waiters]
    try:
        await quick.long_polls_waiting(len(waiters))
        first = await wait_until(lambda: _poll_time(quick, worker.id), what="a first published poll")
        later = await wait_until(lambda: _poll_time(quick, worker.id, after=first), what="the last poll to move")
        assert later > first
        # Polled many times per interval; the statements are the intervals, not the polls.
        await wait_until(lambda: len(polls) >= 60, what="60 polls")
        assert (await shown(quick, worker.id))["liveness"] == "live"
        assert await listed(quick, "live") == {str(w.id) for w in [worker, *waiters]}
    finally:
        polling.cancel()
        for task in parked:
            task.cancel()
        await asyncio.gather(polling, *parked, return_exceptions=True)
    elapsed = time.monotonic() - started
    statements = await quick.count("SELECT count(*) FROM presence_writes")  # one statement each
    intervals = elapsed / SHORT["presence_publish_seconds"]
    print(f"presence_writes {statements} polls {len(polls)} long_polls_waiting 10 seconds {elapsed:.2f}")
    assert 2 <= statements <= intervals + 1, (statements, intervals, len(polls))
    assert len(polls) >= 4 * statements, (statements, len(polls))
    metrics = quick.app[METRICS]
    assert metrics.presence_publishes._value.get() >= statements  # the metric counts the same statements


async def _poll_time(gateway: RunningGateway, worker_id: UUID, *, after: str | None = None) -> str | None:
    at = (await shown(gateway, worker_id))["last_poll_at"]
    return at if at is not None and (after is None or datetime.fromisoformat(at) > datetime.fromisoformat(after)) \
        else None


async def test_a_worker_that_stops_polling_turns_idle_then_gone_and_the_filter_agrees(quick: RunningGateway) -> None:
    worker, never = await quick.worker(), await quick.worker()
    polls: list[float] = []
    polling = asyncio.create_task(keep_polling(worker, polls))
    try:
        await wait_until(lambda: _liveness_is(quick, worker.id, "live"), what="the polling worker live")
        assert str(worker.id) in await listed(quick, "live")
    finally:
        polling.cancel()
        await asyncio.gather(polling, return_exceptions=True)
    assert str(never.id) in await listed(quick, "gone") and str(never.id) not in await listed(quick, "live")
    # Nothing more from it: idle once worker_live_seconds have passed, gone after worker_idle_seconds.
    await wait_until(lambda: _liveness_is(quick, worker.id, "idle"), what="the silent worker idle")
    assert str(worker.id) in await listed(quick, "idle") and str(worker.id) not in await listed(quick, "live")
    await wait_until(lambda: _liveness_is(quick, worker.id, "gone"), what="the silent worker gone")
    assert str(worker.id) in await listed(quick, "gone")
    body = await shown(quick, worker.id)
    assert body["last_poll_at"] is not None  # gone, but its last poll is still known
    assert_problem(await quick.operator("GET", "/v1/workers?liveness=asleep"), 422)


async def test_the_console_shows_liveness_and_the_last_poll(quick: RunningGateway) -> None:
    worker, never = await quick.worker(), await quick.worker()
    assert (await worker.acquire()).status == 204
    await wait_until(lambda: _liveness_is(quick, worker.id, "live"), what="the worker live")
    browser = await signed_in(quick)
    listing = await browser.get("/console/workers")
    rows = {r[0]: r for r in listing.rows("Workers")}
    assert rows[worker.name][3] == "live" and rows[worker.name][4].startswith("20")
    assert rows[never.name][3] == "gone"
    detail = await browser.get(f"/console/workers/{worker.id}")
    assert '<td data-field="liveness">live</td>' in detail.text


async def test_a_long_poll_longer_than_the_live_window_keeps_its_worker_live(quick: RunningGateway) -> None:
    worker = await quick.worker()
    wait = 5  # more than worker_live_seconds (1.5 s)
    started = time.monotonic()
    poll = asyncio.create_task(worker.acquire(wait=wait))
    await quick.long_polls_waiting(1)
    seen: list[str] = []
    while not poll.done() and time.monotonic() - started < wait - 0.5:
        seen.append((await shown(quick, worker.id))["liveness"])
        await asyncio.sleep(0.1)  # a look every 0.1 s for the length of the long-poll
    assert (await poll).status == 204
    assert time.monotonic() - started >= wait - 0.5 and len(seen) >= 10
    # Live from its first publish on, for the whole wait: never idle while it waits.
    assert "idle" not in seen and seen[-1] == "live", seen


async def _liveness_is(gateway: RunningGateway, worker_id: UUID, state: str) -> bool:
    return (await shown(gateway, worker_id))["liveness"] == state


async def test_renewals_and_writes_are_known_and_shown_to_an_administrator_only(quick: RunningGateway) -> None:
    tenant = await make_tenant(quick)  # its worker holds a lease on the tenant's task
    renewed = await tenant.worker.write(tenant.lease, "renew")
    assert renewed.status == 200
    ran = await tenant.worker.write(tenant.lease, "progress")
    assert ran.status == 200

    async def both_published() -> dict[str, Any] | None:
        body = await shown(quick, tenant.worker_id)
        return body if body["last_renew_at"] and body["last_write_at"] else None

    admin_view = await wait_until(both_published, what="the renewal and the write published")
    assert admin_view["liveness"] == "live"
    as_tenant = await shown(quick, tenant.worker_id, key=tenant.key)
    assert as_tenant["liveness"] == "live" and as_tenant["last_poll_at"] is not None
    assert as_tenant["last_renew_at"] is None and as_tenant["last_write_at"] is None
    # Presence is not a lifecycle fact: no event, and the rebuilt projections still equal the live ones.
    assert await quick.count("SELECT count(*) FROM events WHERE topic LIKE '%%Presence%%'") == 0
    await rebuilt_equals_live(quick)


async def test_a_publish_never_moves_a_time_back_and_skips_unknown_workers(quick: RunningGateway) -> None:
    """Two processes publish the same worker: whichever comes last, each time is the latest seen."""
    worker = await quick.worker()
    stranger = UUID(int=7)
    async with quick.pool.connection() as conn:
        now = await (await conn.execute("SELECT clock_timestamp()")).fetchone()
        assert now is not None
        ids = sorted([worker.id, stranger])
        assert await publish(conn, [worker.id], ([1.0], [None], [5.0]), now=now[0]) == 1
        assert await publish(conn, ids, ([30.0, 30.0], [2.0, 2.0], [60.0, 60.0]), now=now[0]) == 1
    row = await _presence_row(quick, worker.id)
    assert (now[0] - row[0]).total_seconds() == 1.0 and (now[0] - row[1]).total_seconds() == 2.0
    assert (now[0] - row[2]).total_seconds() == 5.0
    assert await quick.count("SELECT count(*) FROM worker_presence WHERE worker_id = %s", stranger) == 0


async def _presence_row(gateway: RunningGateway, worker_id: UUID) -> tuple[Any, ...]:
    async with gateway.pool.connection() as conn:
        cur = await conn.execute("SELECT last_poll_at, last_renew_at, last_write_at FROM worker_presence "
                                 "WHERE worker_id = %s", (worker_id,))
        row = await cur.fetchone()
    assert row is not None
    return tuple(row)


async def test_no_write_per_poll_and_a_stopping_gateway_publishes_what_it_held(database_url: str,
                                                                               pki: PkiPaths) -> None:
    async with running_gateway(database_url, pki, presence_publish_seconds=600) as gw:
        worker = await gw.worker()
        for _ in range(20):
            assert (await worker.acquire()).status == 204
        assert await gw.count("SELECT count(*) FROM worker_presence") == 0  # twenty polls, no write
        assert (await shown(gw, worker.id))["liveness"] == "gone"
        stopped_after = await gw.count("SELECT clock_timestamp()")
    async with running_gateway(database_url, pki, presence_publish_seconds=600) as again:
        body = await shown(again, worker.id)
        assert body["last_poll_at"] is not None and body["liveness"] == "live"
        assert datetime.fromisoformat(body["last_poll_at"]) <= stopped_after


async def test_a_killed_gateway_loses_at_most_about_one_interval_and_its_successor_carries_on(
        database_url: str, pki: PkiPaths, live_services: Services, tmp_path: Path) -> None:
    interval = 1.0
    # The worker polls without pause (faster than a certificate's rate limit lets it: out of the way here).
    gateway = GatewayProcess(database_url, pki, tmp_path / "gateway.log", {
        "presence_publish_seconds": interval, "rate_limit_per_second": 1e6, "rate_limit_burst": 1_000_000})
    await gateway.start()
    view: RunningGateway | None = None
    try:
        org = await live_services.registry.create_organization(f"org-{uuid4().hex[:12]}")
        scan = await live_services.scans.create_scan(org, {"targets": ["192.0.2.10"]})
        view = gateway.client(live_services, org, scan)
        worker = await view.worker()
        polls: list[float] = []
        polling = asyncio.create_task(keep_polling(worker, polls))
        try:
            async def published_twice() -> bool:
                return await gateway.metric("leasehold_presence_publishes_total") >= 2
            await wait_until(published_twice, what="two publishes with the worker polling")
            assert await view.count("SELECT count(*) FROM worker_presence WHERE worker_id = %s", worker.id) == 1
            before = len(polls)
            await wait_until(lambda: len(polls) > before + 5, what="more polls")
            await gateway.kill()  # SIGKILL while the worker polls: what it held since its last publish is lost
            killed_at = await view.count("SELECT clock_timestamp()")
        finally:
            polling.cancel()
            await asyncio.gather(polling, return_exceptions=True)
        kept = await view.count("SELECT last_poll_at FROM worker_presence WHERE worker_id = %s", worker.id)
        lost = (killed_at - kept).total_seconds()
        print(f"presence_lost_on_kill_seconds {lost:.3f} interval {interval}")
        assert lost <= interval + 1.5, lost  # one interval, plus the publish's own time, a poll's and the kill's

        await gateway.start()  # the successor knows nothing in memory; the published times stand
        assert (await worker.acquire()).status == 204
        moved = await wait_until(lambda: view.count(
            "SELECT last_poll_at FROM worker_presence WHERE worker_id = %s AND last_poll_at > %s", worker.id, kept),
            what="the successor to publish the next poll")
        assert moved > kept
    finally:
        if view is not None:
            for session in view.sessions:
                await session.close()
        await gateway.stop()
