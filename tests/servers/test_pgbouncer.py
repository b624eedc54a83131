"""The Gateway behind a real PgBouncer in transaction mode.

Every transaction of the Gateway goes through PgBouncer (``pool_mode = transaction``, three server
connections for a Gateway pool of twelve), so consecutive transactions of one Gateway connection
land on different server connections: nothing may rely on session state. Prepared statements are
off (``--no-prepared-statements``: the installed PgBouncer predates 1.21, which tracks them), and
the LISTEN connection of the wake-ups goes to the server directly (``--notify-database-url``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from replicas.replicas_support import RedisServer

from leasehold.gateway.keys import HINTS, NOTIFIER
from support.core import assert_log_rebuilds_live
from support.gateway import RunningGateway, WorkerClient, running_gateway
from support.servers import PgBouncer, free_port_in, pgbouncer_binary
from support.waits import wait_until

#: PgBouncer's ports in these tests.
PORTS = (6440, 6449)
#: Server connections PgBouncer may open to the database: fewer than the Gateway's pool.
SERVER_CONNECTIONS = 3
#: A long-poll woken by NOTIFY answers within this after the task's creation is acknowledged.
WAKE_BOUND_SECONDS = 2.0


@pytest.fixture
def pgbouncer(database_url: str) -> Iterator[PgBouncer]:
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)")
    bouncer = PgBouncer(binary, database_url, free_port_in(*PORTS), pool_size=SERVER_CONNECTIONS)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()


def _dbname(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def _gateway(database_url: str, bouncer: PgBouncer, pki: Any, **overrides: Any) -> Any:
    """A Gateway whose pool goes through PgBouncer and whose LISTEN goes to the server. A long
    safety poll, so that only a wake-up can answer a long-poll quickly."""
    return running_gateway(bouncer.url(_dbname(database_url)), pki, notify_database_url=database_url,
                           prepared_statements=False, pool_size=12, poll_interval_seconds=30, **overrides)


async def _lifecycle(gateway: RunningGateway, worker: WorkerClient) -> str:
    reply = await worker.acquire(wait=10)
    assert reply.status == 200, (reply.status, reply.body)
    lease = reply.body["lease"]
    for action in ("progress", "renew", "renew"):
        r = await worker.write(lease, action)
        assert r.status == 200, (action, r.status, r.body)
    r = await worker.final_batch(lease, [{"type": "asset", "kind": "host", "value": "127.0.0.1"}])
    assert r.status == 200 and r.body["duplicate"] is False, r.body
    r = await worker.write(lease, "complete")
    assert r.status == 200 and r.body["task"]["state"] == "completed", r.body
    return str(lease["task"]["id"])


def _database_stats(bouncer: PgBouncer, dbname: str) -> dict[str, Any]:
    return next(row for row in bouncer.show("STATS") if row["database"] == dbname)


async def test_worker_lifecycles_run_through_pgbouncer_in_transaction_mode(
        database_url: str, pki: Any, pgbouncer: PgBouncer) -> None:
    dbname = _dbname(database_url)
    # The background loops run through PgBouncer too: the sweeper, the scheduler and, this often,
    # the checkpoints of the stream heads (one REPEATABLE READ transaction each).
    async with _gateway(database_url, pgbouncer, pki, checkpoint_interval_seconds=0.3) as gateway:
        workers = [await gateway.worker(capacity=1) for _ in range(6)]
        created = {str(await gateway.task()) for _ in range(6)}
        before = int(_database_stats(pgbouncer, dbname)["total_xact_count"])
        # Six workers race through acquire, progress, renewals, a result batch and complete.
        done = await asyncio.gather(*(_lifecycle(gateway, w) for w in workers))
        assert set(done) == created
        task = await gateway.operator("GET", f"/v1/tasks/{done[0]}")
        assert task.status == 200 and task.body["state"] == "completed", task.body
        # Every one of those went through PgBouncer, sharing its three server connections.
        transactions = int(_database_stats(pgbouncer, dbname)["total_xact_count"]) - before
        assert transactions >= 6 * 6, transactions
        servers = [s for s in pgbouncer.show("SERVERS") if s["database"] == dbname]
        assert 1 <= len(servers) <= SERVER_CONNECTIONS, servers
        events = await gateway.count("SELECT count(*) FROM events")
        async def sealed() -> bool:
            return await gateway.count("SELECT coalesce(max(event_count), 0) FROM checkpoints") >= events

        await wait_until(sealed, 10, what="a checkpoint to seal every event", interval=0.05)
    # The log the pooled transactions wrote is whole: chains intact, rebuild equals live.
    await assert_log_rebuilds_live(database_url)


async def test_a_long_poll_behind_pgbouncer_wakes_on_the_task_created(
        database_url: str, pki: Any, pgbouncer: PgBouncer) -> None:
    """Wake-ups by NOTIFY: sent through PgBouncer, heard on the direct LISTEN connection."""
    async with _gateway(database_url, pgbouncer, pki) as gateway:
        await _wakes_up(gateway)


async def test_without_listen_behind_pgbouncer_redis_hints_wake_the_long_poll(
        database_url: str, pki: Any, pgbouncer: PgBouncer, redis_server: RedisServer) -> None:
    """No direct connection at all: ``--no-listen``, and the Redis hints carry the wake-ups."""
    async with running_gateway(pgbouncer.url(_dbname(database_url)), pki, prepared_statements=False, listen=False,
                               redis_url=redis_server.url, pool_size=12, poll_interval_seconds=30) as gateway:
        hints = gateway.app[HINTS]
        await wait_until(lambda: hints.connected, 10, what="the subscription to the Redis hints")
        await _wakes_up(gateway)
        assert not gateway.app[NOTIFIER].connected.is_set()


async def _wakes_up(gateway: RunningGateway) -> None:
    """Three times: a worker's long-poll parks, a task is created through the operator API (its
    transaction through PgBouncer), and the long-poll answers with it within the bound, while the
    safety poll is 30 s away."""
    worker = await gateway.worker()
    await gateway.task(task_type="hold")  # no worker takes it: the scan stays open for new tasks
    for _ in range(3):
        waiting = asyncio.create_task(worker.acquire(wait=20))
        await gateway.long_polls_waiting()
        # Created through the operator API: its transaction (and its NOTIFY) go through PgBouncer.
        reply = await gateway.operator("POST", f"/v1/scans/{gateway.scan}/tasks",
                                       {"task_type": "probe", "lease_seconds": 30,
                                        "execution_timeout_seconds": 600})
        assert reply.status == 201, reply.body
        acknowledged = time.perf_counter()
        answer = await asyncio.wait_for(waiting, WAKE_BOUND_SECONDS + 5)
        woke = time.perf_counter() - acknowledged
        assert answer.status == 200 and answer.body["lease"]["task"]["id"] == reply.body["id"], answer.body
        assert woke < WAKE_BOUND_SECONDS, woke
        lease = answer.body["lease"]
        assert (await worker.final_batch(lease)).status == 200
        assert (await worker.write(lease, "complete")).status == 200
