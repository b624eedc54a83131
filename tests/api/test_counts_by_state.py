"""``GET /v1/counts`` counts tasks by state without reading the task rows (completed is each
organisation's total less its other states): it must equal a ``GROUP BY`` over the rows for
every mix, an organisation with only completed tasks, one with none, one with every state."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from support.gateway import LOOPBACK_ALLOWED, RunningGateway, WorkerClient, tenant

STATES = ("pending", "leased", "running", "retry_wait", "completed", "failed_terminal", "cancelling", "cancelled")


async def by_state(gateway: RunningGateway) -> dict[str, dict[str, int]]:
    async with gateway.pool.connection() as conn:
        cur = await conn.execute("SELECT organization_id::text, state::text, count(*) FROM worker_tasks GROUP BY 1, 2")
        found: dict[str, dict[str, int]] = {}
        for org, state, count in await cur.fetchall():
            found.setdefault(org, dict.fromkeys(STATES, 0))[state] = count
        return found


async def leased(worker: WorkerClient) -> dict[str, Any]:
    reply = await worker.acquire()
    assert reply.status == 200, reply.body
    return reply.body["lease"]


async def end(worker: WorkerClient, how: str) -> None:
    lease = await leased(worker)
    if how == "complete":
        assert (await worker.final_batch(lease)).status == 200
        assert (await worker.write(lease, "complete")).status == 200
    elif how == "fail":
        assert (await worker.write(lease, "fail", error="crashed", retryable=False)).status == 200
    elif how == "retry":
        assert (await worker.write(lease, "fail", error="flaky", retryable=True)).status == 200
    elif how == "run":
        assert (await worker.write(lease, "progress")).status == 200


async def test_counts_by_state_equal_a_group_by_over_the_rows(gateway: RunningGateway) -> None:
    every, _ = await tenant(gateway, "every-state")
    only_completed, _ = await tenant(gateway, "only-completed")
    nothing_completed, _ = await tenant(gateway, "nothing-completed")
    for org, plan in ((every, ["complete", "complete", "fail", "retry", "run", "lease", "cancel-running", "cancel",
                               "wait"]),
                      (only_completed, ["complete", "complete", "complete"]),
                      (nothing_completed, ["wait", "wait", "run"])):
        org_id = UUID(org)
        await gateway.registry.set_target_policy(org_id, LOOPBACK_ALLOWED)
        scan = await gateway.scans.create_scan(org_id, {"targets": ["127.0.0.1"]})
        worker = await gateway.worker(org=org_id, capacity=20)
        tasks = [await gateway.task(scan=scan) for _ in plan]  # every task exists before any ends
        for step, task_id in zip(plan, tasks, strict=True):
            if step == "cancel":
                await gateway.lifecycle.request_cancel(task_id, actor="test")
            elif step == "cancel-running":
                await end(worker, "run")
                await gateway.lifecycle.request_cancel(task_id, actor="test")
            elif step == "lease":
                await leased(worker)
            elif step != "wait":
                await end(worker, step)

    in_rows = await by_state(gateway)
    assert sum(1 for n in in_rows[every].values() if n) >= 5 and in_rows[every]["completed"] == 2
    assert in_rows[only_completed] == {**dict.fromkeys(STATES, 0), "completed": 3}
    assert in_rows[nothing_completed]["completed"] == 0
    counted = (await gateway.operator("GET", "/v1/counts")).body["organizations"]
    shown = {o["organization_id"]: o["tasks_by_state"] for o in counted}
    for org, states in in_rows.items():
        assert shown[org] == states, org
    for org in (every, only_completed, nothing_completed):  # one organisation at a time, too
        one = (await gateway.operator("GET", f"/v1/counts?organization_id={org}")).body["organizations"]
        assert [o["tasks_by_state"] for o in one] == [in_rows[org]]
