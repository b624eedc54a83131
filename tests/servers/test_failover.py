"""The Gateway on a Patroni cluster: a primary that fails over loses nothing the workers were told.

A module-scoped cluster (``support.patroni``: etcd, two PostgreSQL 15 nodes, synchronous mode)
and an in-process Gateway whose database URL lists both nodes with
``target_session_attrs=read-write``. A worker's command sent while the primary is gone waits
for the promoted standby (its connection lost, nothing committed: the Gateway runs it again
there) and is answered 200; what was acknowledged before the failover is on the new primary.
Then the failover soak at smoke size (``bench/failover.py``: two failovers under load, etcd's
leader member killed and started again, a session idle in a transaction, the operator's reads
all along, the per-task checker, ``replay verify`` and ``verify-chain``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from leasehold.migrations import runner as migrate
from support.gateway import RunningGateway, running_gateway
from support.patroni import PatroniCluster, patroni_available, patroni_cluster

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DATABASE = "leasehold"


@pytest.fixture(scope="module")
def cluster() -> Iterator[PatroniCluster]:
    reason = patroni_available()
    if reason is not None:
        pytest.skip(reason)
    with patroni_cluster() as running:
        with psycopg.connect(running.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        migrate.upgrade(running.url(DATABASE))
        yield running


async def _count(gateway: RunningGateway, task_id: object, kind: str) -> int:
    return int(await gateway.count("SELECT count(*) FROM events WHERE originator_id = %s AND topic LIKE %s",
                                   task_id, f"%{kind}"))


@pytest.mark.parametrize("fault", ["node_kill", "switchover", "postgres_kill_failover"])
async def test_a_worker_write_during_a_failover_is_answered_once(cluster: PatroniCluster, pki: Any,
                                                                 fault: str) -> None:
    await asyncio.to_thread(cluster.wait_healthy)
    async with running_gateway(cluster.url(DATABASE), pki) as gateway:
        worker = await gateway.worker()
        tasks = {str(await gateway.task()), str(await gateway.task())}  # the second keeps the scan open
        lease = (await worker.acquire()).body["lease"]
        task_id = lease["task"]["id"]
        assert (await worker.final_batch(lease)).status == 200
        before = await asyncio.to_thread(cluster.wait_leader)

        if fault == "node_kill":
            dead = await asyncio.to_thread(cluster.kill_leader_node)
            # Sent while no server accepts writes: it waits for the promotion, then succeeds.
            done = await worker.write(lease, "complete")
            cluster.start_node(dead)
        else:
            change = cluster.switchover if fault == "switchover" else cluster.kill_postgres_and_fail_over
            switching = asyncio.create_task(asyncio.to_thread(change))
            done = await worker.write(lease, "complete")
            await switching
        assert done.status == 200 and done.body["task"]["state"] == "completed", done.body
        after = await asyncio.to_thread(cluster.wait_healthy, 120.0)
        assert after.name != before.name, cluster.members()

        # On the new primary: the acknowledged batch and one completion; the lease still fenced.
        assert await _count(gateway, task_id, "ResultBatchAccepted") == 1
        assert await _count(gateway, task_id, "TaskCompleted") == 1
        again = await worker.write(lease, "complete")
        assert again.status == 200 and await _count(gateway, task_id, "TaskCompleted") == 1
        # The Gateway keeps working on the new primary: a new task, leased and completed.
        lease2 = (await worker.acquire()).body["lease"]
        assert lease2["task"]["id"] == (tasks - {task_id}).pop()
        assert (await worker.final_batch(lease2)).status == 200
        assert (await worker.write(lease2, "complete")).status == 200


def test_failover_soak_at_smoke_size(tmp_path: Path) -> None:
    reason = patroni_available()
    if reason is not None:
        pytest.skip(reason)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "failover.py"), "--failovers", "2", "--workers", "2",
         "--tasks", "60", "--feed-seconds", "60", "--etcd-member-loss-seconds", "4", "--idle-in-tx-seconds", "2",
         "--window-seconds", "1", "--json", "--workdir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=900, check=False)
    assert done.stdout.strip(), done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failovers"] >= 2, result
    assert all(v == 0 for v in result["counts"].values()), result
    assert result["verify"]["ok"] is True and result["verify_chain"]["ok"] is True, result
    # One etcd member of three lost: the same primary (and timeline) throughout, the member back.
    loss = result["etcd_member_loss"]
    assert loss["primary_kept"] is True and loss["primary_before"] is not None, loss
    # The held session was idle in its transaction, and the soak's tasks went on meanwhile.
    idle = result["idle_in_tx"]
    assert idle["held_state"] == "idle in transaction", idle
    assert idle["windows"]["during"]["oldest_xmin_age"] is not None, idle
    # The operator read all along: every answer 200 or 503, and the Gateway answered no other 5xx.
    assert sum(sum(c.values()) for c in result["operator_reads"].values()) > 0, result
    assert result["operator_reads_not_200_or_503"] == 0 and result["gateway_5xx_not_503"] == 0, result
    assert result["ok"] is True, (result, done.stderr[-4000:])
