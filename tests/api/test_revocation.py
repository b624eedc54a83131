"""Revocation over HTTP (RFC "Cancellation", assignment revocation defaults):

* new leases stop immediately, in every case (even for an acquire already long-polling);
* a revoked or disabled worker is refused on its very next request, on an open connection;
* a security revocation (of the worker, or of an assignment) moves the worker's active tasks
  (of that organisation) to ``cancelling``, and their later writes are refused;
* a routine reassignment with ``finish_active=true`` lets the active task complete;
* an interrupted revocation is finished by repeating it, which is otherwise a no-op.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import aiohttp
import pytest
from test_operator_api import assert_problem

from support.gateway import RunningGateway, WorkerClient, running_gateway
from support.waits import wait_until

WRITES = ("progress", "renew", "results", "complete", "fail", "cancel-ack")


async def send(worker: WorkerClient, lease: dict[str, Any], action: str) -> Any:
    if action == "results":
        return await worker.final_batch(lease)
    if action == "fail":
        return await worker.write(lease, action, error="boom")
    return await worker.write(lease, action)


async def state(gateway: RunningGateway, task: Any) -> str:
    return str(await gateway.count("SELECT state FROM worker_tasks WHERE id = %s", UUID(str(task))))


async def _is(gateway: RunningGateway, task: Any, wanted: str) -> bool:
    return await state(gateway, task) == wanted


async def events(gateway: RunningGateway) -> int:
    return int(await gateway.count("SELECT count(*) FROM events"))


@dataclass
class Connections:
    """Counts, through aiohttp's tracing signals, the TCP connections a session opens and reuses."""

    opened: int = 0
    reused: int = 0

    def trace(self) -> aiohttp.TraceConfig:
        config = aiohttp.TraceConfig()

        async def opened(*_: Any) -> None:
            self.opened += 1

        async def reused(*_: Any) -> None:
            self.reused += 1

        config.on_connection_create_end.append(opened)
        config.on_connection_reuseconn.append(reused)
        return config


async def traced_worker(gateway: RunningGateway) -> tuple[WorkerClient, Connections]:
    """A worker whose session keeps one connection alive and reports how it is used."""
    worker = await gateway.worker()
    connections = Connections()
    workers_dir = gateway.pki.directory / "workers"
    ssl = gateway.worker_ssl(workers_dir / f"{worker.name}.pem", workers_dir / f"{worker.name}-key.pem")
    worker.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl, limit=1),
                                           trace_configs=[connections.trace()])
    gateway.sessions.append(worker.session)
    return worker, connections


@pytest.mark.parametrize("action", ["revoke", "disable"])
async def test_worker_is_refused_on_its_next_request_over_an_open_keep_alive_connection(
        gateway: RunningGateway, action: str) -> None:
    worker, connections = await traced_worker(gateway)
    await gateway.task()
    r = await worker.acquire()
    assert r.status == 200
    lease = r.body["lease"]
    assert (await worker.write(lease, "progress")).status == 200
    r = await gateway.operator("POST", f"/v1/workers/{worker.id}/{action}", {} if action == "revoke" else None)
    assert r.status == 200, r.body
    r = await worker.write(lease, "renew")
    assert_problem(r, 403)
    assert ("revoked" if action == "revoke" else "disabled") in r.body["detail"]
    # Three requests, one TCP (and TLS) connection: the refusal bit on the open connection.
    assert (connections.opened, connections.reused) == (1, 2)


async def test_worker_revocation_cancels_its_active_tasks_and_refuses_their_writes(gateway: RunningGateway) -> None:
    worker = await gateway.worker(capacity=2)
    bystander = await gateway.worker()
    tasks = [await gateway.task(), await gateway.task()]
    leases = [(await worker.acquire()).body["lease"] for _ in tasks]
    assert (await worker.write(leases[0], "progress")).status == 200

    r = await gateway.operator("POST", f"/v1/workers/{worker.id}/revoke", {"reason": "private key leaked"})
    assert r.status == 200, r.body
    assert sorted(r.body["cancelled_task_ids"]) == sorted(str(t) for t in tasks)
    assert r.body["worker"]["revoked_at"] is not None and r.body["worker"]["enabled"] is False
    assert [await state(gateway, t) for t in tasks] == ["cancelling", "cancelling"]
    history = (await gateway.operator("GET", f"/v1/tasks/{tasks[0]}/events")).body["items"]
    assert history[-1]["type"] == "CancelRequested" and history[-1]["actor"].startswith("operator:")
    assert history[-1]["payload"]["reason"] == "worker revoked: private key leaked"

    before = await events(gateway)
    for lease in leases:
        for action in WRITES:
            assert_problem(await send(worker, lease, action), 403)
    assert await events(gateway) == before  # refused at the door: nothing to record
    assert [await state(gateway, t) for t in tasks] == ["cancelling", "cancelling"]

    fresh = await gateway.task()
    assert_problem(await worker.acquire(), 403)
    r = await bystander.acquire()
    assert r.status == 200 and r.body["lease"]["task"]["id"] == str(fresh)


async def test_gateway_terminates_the_tasks_a_revoked_worker_can_no_longer_acknowledge(
        database_url: str, pki: Any) -> None:
    async with running_gateway(database_url, pki, cancel_grace_seconds=1) as gw:
        worker = await gw.worker()
        task = await gw.task()
        lease = (await worker.acquire()).body["lease"]
        await worker.write(lease, "progress")
        assert (await gw.operator("POST", f"/v1/workers/{worker.id}/revoke", {})).status == 200
        await wait_until(lambda: _is(gw, task, "cancelled"), 10, what="the revoked worker's task to be cancelled")
        r = await gw.operator("GET", f"/v1/tasks/{task}")
        assert r.body["attempts"][0]["status"] == "cancelled"


async def test_assignment_revocation_cancels_that_organisations_task_and_rejects_its_writes(
        gateway: RunningGateway) -> None:
    other = await gateway.registry.create_organization("other tenant")
    other_scan = await gateway.scans.create_scan(other, {})
    worker = await gateway.worker(capacity=2)  # assigned to gateway.org
    r = await gateway.operator("POST", f"/v1/workers/{worker.id}/assignments", {"organization_id": str(other)})
    assert r.status == 200
    mine = await gateway.task()
    mine_lease = (await worker.acquire()).body["lease"]
    theirs = await gateway.task(scan=other_scan)
    theirs_lease = (await worker.acquire()).body["lease"]
    assert mine_lease["task"]["id"] == str(mine) and theirs_lease["task"]["id"] == str(theirs)
    for lease in (mine_lease, theirs_lease):
        assert (await worker.write(lease, "progress")).status == 200

    r = await gateway.operator("POST", f"/v1/workers/{worker.id}/assignments/{gateway.org}/revoke",
                               {"reason": "tenant offboarded"})
    assert r.status == 200 and r.body["cancelled_task_ids"] == [str(mine)]
    assert {a["organization_id"]: a["state"] for a in r.body["worker"]["assignments"]} == {
        str(gateway.org): "revoked", str(other): "active"}
    assert await state(gateway, mine) == "cancelling" and await state(gateway, theirs) == "running"

    # The worker itself is still trusted, so its writes reach the task — and fencing refuses them.
    before = await events(gateway)
    for action in ("progress", "results", "complete", "fail"):
        reply = await send(worker, mine_lease, action)
        assert_problem(reply, 409)
        assert reply.body["type"].endswith("task-cancelled"), (action, reply.body)
    assert await events(gateway) == before + 4  # each refusal is recorded
    renewed = await worker.write(mine_lease, "renew")
    assert renewed.status == 200 and renewed.body["cancel_requested"] is True
    assert renewed.body["lease_expires_at"] == mine_lease["lease_expires_at"]  # not extended
    assert (await worker.write(mine_lease, "cancel-ack")).body["task"]["state"] == "cancelled"

    # The other organisation's task is untouched and completes.
    assert (await worker.final_batch(theirs_lease)).status == 200
    assert (await worker.write(theirs_lease, "complete")).body["task"]["state"] == "completed"

    # New leases: none of the revoked organisation's, the other's as before. (Both scans were
    # settled with their only job, so the new tasks need scans of their own.)
    new_mine = await gateway.task(scan=await gateway.scans.create_scan(gateway.org, {}))
    assert (await worker.acquire()).status == 204
    new_theirs = await gateway.task(scan=await gateway.scans.create_scan(other, {}))
    r = await worker.acquire()
    assert r.status == 200 and r.body["lease"]["task"]["id"] == str(new_theirs)
    assert await state(gateway, new_mine) == "pending"


async def test_routine_reassignment_lets_the_active_task_complete(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    task = await gateway.task()
    lease = (await worker.acquire()).body["lease"]
    assert (await worker.write(lease, "progress")).status == 200

    r = await gateway.operator("DELETE", f"/v1/workers/{worker.id}/assignments/{gateway.org}?finish_active=true")
    assert r.status == 200 and r.body["cancelled_task_ids"] == []
    assert [a["state"] for a in r.body["worker"]["assignments"]] == ["removed"]
    next_task = await gateway.task()
    assert (await worker.acquire()).status == 204  # new leases stop at once

    renewed = await worker.write(lease, "renew")
    assert renewed.status == 200 and renewed.body["cancel_requested"] is False
    assert renewed.body["lease_expires_at"] > lease["lease_expires_at"]
    assert (await worker.final_batch(lease)).status == 200
    done = await worker.write(lease, "complete")
    assert done.status == 200 and done.body["task"]["state"] == "completed"
    assert await state(gateway, task) == "completed" and await state(gateway, next_task) == "pending"


async def test_removal_without_finish_active_cancels_the_active_task(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    task = await gateway.task()
    lease = (await worker.acquire()).body["lease"]
    r = await gateway.operator("DELETE", f"/v1/workers/{worker.id}/assignments/{gateway.org}")
    assert r.status == 200 and r.body["cancelled_task_ids"] == [str(task)]
    assert await state(gateway, task) == "cancelling"
    assert (await worker.write(lease, "renew")).body["cancel_requested"] is True
    assert_problem(await worker.final_batch(lease), 409)


async def test_an_interrupted_revocation_is_finished_by_repeating_it(gateway: RunningGateway) -> None:
    worker = await gateway.worker(capacity=2)
    tasks = [await gateway.task(), await gateway.task()]
    leases = [(await worker.acquire()).body["lease"] for _ in tasks]
    # The revocation committed, then the Gateway died before cancelling anything.
    await gateway.registry.revoke_worker(worker.id, reason="compromised", actor="operator:test")
    assert [await state(gateway, t) for t in tasks] == ["leased", "leased"]
    assert_problem(await worker.write(leases[0], "renew"), 403)  # its leases cannot be kept alive

    r = await gateway.operator("POST", f"/v1/workers/{worker.id}/revoke", {"reason": "compromised"})
    assert r.status == 200 and sorted(r.body["cancelled_task_ids"]) == sorted(str(t) for t in tasks)
    before = await events(gateway)
    r = await gateway.operator("POST", f"/v1/workers/{worker.id}/revoke", {"reason": "compromised"})
    assert r.status == 200 and r.body["cancelled_task_ids"] == []
    assert await events(gateway) == before
    assert await gateway.count("SELECT count(*) FROM events WHERE originator_id = %s AND topic LIKE %s",
                               worker.id, "%WorkerRevoked") == 1


@pytest.mark.parametrize("action", ["revoke", "disable", "revoke_assignment", "remove", "remove_finish_active"])
async def test_new_leases_stop_immediately_even_for_a_waiting_long_poll(gateway: RunningGateway,
                                                                        action: str) -> None:
    worker = await gateway.worker()
    other = await gateway.worker()
    waiting = asyncio.create_task(worker.acquire(wait=2))
    await gateway.long_polls_waiting()
    base = f"/v1/workers/{worker.id}"
    method, path, body = {
        "revoke": ("POST", f"{base}/revoke", {}),
        "disable": ("POST", f"{base}/disable", None),
        "revoke_assignment": ("POST", f"{base}/assignments/{gateway.org}/revoke", {}),
        "remove": ("DELETE", f"{base}/assignments/{gateway.org}", None),
        "remove_finish_active": ("DELETE", f"{base}/assignments/{gateway.org}?finish_active=true", None),
    }[action]
    assert (await gateway.operator(method, path, body)).status == 200
    task = await gateway.task()  # wakes the waiting acquire, which must not take it
    # A revoked or disabled worker hears so (its standing is checked on every poll round); an
    # unassigned one is still a worker in good standing, with nothing to do.
    assert (await waiting).status == (403 if action in ("revoke", "disable") else 204)
    assert await state(gateway, task) == "pending"
    r = await other.acquire()
    assert r.status == 200 and r.body["lease"]["task"]["id"] == str(task)
