"""Analysts and lag-tolerant operator reads on a real streaming replica.

The module starts a private primary and a streaming replica of it (``pg_basebackup -R``) from
the same server binaries, on ports 5520-5529, migrates the primary, and lets a Gateway write
lifecycles there. The replica then answers the analyst role's views, refuses every write, and
serves the Gateway's GET reads (``read_database_url``); pausing its replay shows which server
answered. Every wait is for the replica's replay position, never a sleep.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from leasehold import replay
from leasehold.migrations import runner as migrate
from support.gateway import RunningGateway, running_gateway
from support.servers import StreamingPair, free_port_in, server_binaries, streaming_pair

pytestmark = pytest.mark.slow

PORTS = (5520, 5529)
DATABASE = "leasehold"
ANALYST = "analyst_ana"
EXAMPLES = Path(replay.__file__).with_name("analyst_examples.sql")


@pytest.fixture(scope="module")
def pair() -> Iterator[StreamingPair]:
    binaries = server_binaries()
    if binaries is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) on this machine")
    first = free_port_in(*PORTS)
    ports = (first, free_port_in(*PORTS, taken=(first,)))
    with streaming_pair(binaries, ports) as streaming:
        with psycopg.connect(streaming.primary.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
            conn.execute(f"CREATE ROLE {ANALYST} LOGIN")
        migrate.upgrade(streaming.primary.url(DATABASE))
        with psycopg.connect(streaming.primary.url(DATABASE), autocommit=True) as conn:
            conn.execute(f"GRANT leasehold_analyst TO {ANALYST}")
        yield streaming


def _examples() -> dict[str, str]:
    blocks = re.split(r"^-- name: (\w+)\n", EXAMPLES.read_text(), flags=re.M)[1:]
    return {name: body.strip() for name, body in zip(blocks[::2], blocks[1::2], strict=True)}


async def _lifecycle(gateway: RunningGateway) -> str:
    """One task taken, renewed, given a result and completed by a worker; the task's id."""
    worker = await gateway.worker()
    task_id = await gateway.task()
    lease = (await worker.acquire()).body["lease"]
    for action in ("progress", "renew"):
        assert (await worker.write(lease, action)).status == 200
    assert (await worker.final_batch(lease, [{"type": "asset", "kind": "host", "value": "127.0.0.1"}])).status == 200
    assert (await worker.write(lease, "complete")).status == 200
    return str(task_id)


async def test_the_analyst_views_answer_on_the_replica(pair: StreamingPair, pki: Any) -> None:
    async with running_gateway(pair.primary.url(DATABASE), pki) as gateway:
        task_id = await _lifecycle(gateway)
    with psycopg.connect(pair.primary.url(DATABASE)) as conn:
        (events,) = conn.execute("SELECT count(*) FROM events WHERE originator_id = %s", (task_id,)).fetchone() or (0,)
    pair.wait_for_replay()

    with psycopg.connect(pair.replica.url(DATABASE, user=ANALYST)) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        # The task's history, its wait and its attempt, as the primary wrote them.
        assert conn.execute("SELECT count(*) FROM analyst_events WHERE originator_id = %s",
                            (task_id,)).fetchone() == (events,)
        assert events >= 5
        (first_leased,) = conn.execute("SELECT first_leased_at FROM task_wait_times WHERE task_id = %s",
                                       (task_id,)).fetchone() or (None,)
        assert first_leased is not None
        assert conn.execute("SELECT status, batch_count FROM attempt_durations WHERE task_id = %s",
                            (task_id,)).fetchall() == [("succeeded", 1)]
        # Every documented example runs on the replica, as the analyst.
        examples = _examples()
        assert len(examples) >= 10
        answered = {name: conn.execute(statement).fetchall()  # type: ignore[call-overload]
                    for name, statement in examples.items()}
        assert answered["wait_time_per_plugin"], answered
        conn.rollback()
        # The role's limits hold there too: no raw events (lease-token hashes), and no writes at all.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT count(*) FROM events")
        conn.rollback()
    with psycopg.connect(pair.replica.url(DATABASE)) as conn, pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        conn.execute("INSERT INTO organizations (id, name) VALUES (gen_random_uuid(), 'x')")


async def test_gateway_get_reads_are_served_by_the_replica(pair: StreamingPair, pki: Any) -> None:
    async with running_gateway(pair.primary.url(DATABASE), pki,
                               read_database_url=pair.replica.url(DATABASE)) as gateway:
        await gateway.task(task_type="hold")  # no worker takes it: the scan stays open
        task_id = await gateway.task()
        pair.wait_for_replay()
        seen = await gateway.operator("GET", f"/v1/tasks/{task_id}")
        assert seen.status == 200 and seen.body["state"] == "pending", seen.body

        with psycopg.connect(pair.replica.url(DATABASE), autocommit=True) as replica:
            replica.execute("SELECT pg_wal_replay_pause()")
            try:
                # A request that writes reads its answer back from the primary ...
                cancelled = await gateway.operator("POST", f"/v1/tasks/{task_id}/cancel", {"reason": "r"})
                assert cancelled.status == 200 and cancelled.body["state"] == "cancelled", cancelled.body
                late = await gateway.task()
                # ... while a GET is served by the replica, whose replay is paused: it still shows
                # the task pending and does not know the newer task yet.
                stale = await gateway.operator("GET", f"/v1/tasks/{task_id}")
                assert stale.status == 200 and stale.body["state"] == "pending", stale.body
                assert (await gateway.operator("GET", f"/v1/tasks/{late}")).status == 404
                listed = await gateway.operator("GET", f"/v1/tasks?scan_id={gateway.scan}")
                ids = {t["id"] for t in listed.body["items"]}
                assert str(task_id) in ids and str(late) not in ids, listed.body
            finally:
                replica.execute("SELECT pg_wal_replay_resume()")
        pair.wait_for_replay()
        caught_up = await gateway.operator("GET", f"/v1/tasks/{task_id}")
        assert caught_up.status == 200 and caught_up.body["state"] == "cancelled", caught_up.body
        assert (await gateway.operator("GET", f"/v1/tasks/{late}")).status == 200
        counts = await gateway.operator("GET", f"/v1/counts?organization_id={gateway.org}")
        assert counts.status == 200, counts.body
        (org_counts,) = counts.body["organizations"]
        assert org_counts["tasks_by_state"]["cancelled"] == 1 and org_counts["tasks_by_state"]["pending"] == 2, org_counts
