"""The pages of a task's scope over the worker API (``POST …/attempts/{attempt_id}/scope``): the
lease carries the first page, the worker holding the attempt reads the others, and every other
caller gets the refusal a write would get, without anything recorded."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import orjson
import pytest

from leasehold.domain.events import ProfileStep
from leasehold.domain.results import payload_sha256
from leasehold.domain.scopes import ScopeAssembler, ScopeRef, canonical, whole_scope
from support.gateway import LOOPBACK_ALLOWED, RunningGateway, WorkerClient

SCOPE = {"targets": ["127.0.0.1"], "ports": [443],
         "assets": [{"kind": "service", "value": f"127.0.0.{n % 250}:{1000 + n}/tcp"} for n in range(5_000)]}


async def leased(gateway: RunningGateway, worker: WorkerClient, **spec: Any) -> dict[str, Any]:
    await gateway.task(scope=SCOPE, **spec)
    reply = await worker.acquire()
    assert reply.status == 200, reply.body
    return dict(reply.body["lease"])


def assert_problem(reply: Any, status: int, code: str) -> None:
    assert reply.status == status, reply.body
    assert reply.headers["Content-Type"].startswith("application/problem+json")
    assert reply.body["type"].endswith("/" + code), reply.body


async def test_the_worker_reads_every_page_and_puts_the_scope_back_together(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    lease = await leased(gateway, worker)
    ref = lease["task"]["scope_ref"]
    assert ref["assets"] == 5_000 and ref["pages"] > 2 and ref["omitted"] == 0
    assert lease["task"]["scope"]["targets"] == ["127.0.0.1"] and len(lease["task"]["scope"]["assets"]) < 5_000
    pages = []
    for n in range(1, ref["pages"]):
        reply = await worker.write(lease, "scope", page=n)
        assert reply.status == 200, reply.body
        assert (reply.body["task_id"], reply.body["page"], reply.body["pages"]) == (lease["task"]["id"], n, ref["pages"])
        pages.append(reply.body["assets"])
    assert whole_scope(lease["task"]["scope"], pages) == SCOPE
    assembler = ScopeAssembler(lease["task"]["scope"])
    assembled = assembler.start() + b"".join(assembler.add(p) for p in pages) + assembler.finish()
    assert assembled == canonical(SCOPE) and assembler.sha256 == ref["sha256"] and len(assembled) == ref["bytes"]
    assembler.check(ScopeRef(ref["sha256"], ref["bytes"], ref["assets"], ref["pages"]))
    first = await worker.write(lease, "scope", page=0)
    assert first.status == 200 and first.body["assets"] == lease["task"]["scope"]["assets"]
    # Every other answer about the task carries the first page only, with the reference.
    renewed = await worker.write(lease, "renew")
    assert renewed.body["task"]["scope"] == lease["task"]["scope"] and renewed.body["task"]["scope_ref"] == ref


async def test_a_small_scope_travels_whole_in_the_lease(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    await gateway.task(scope={"targets": ["127.0.0.1"], "assets": [{"kind": "host", "value": "127.0.0.1"}]})
    lease = (await worker.acquire()).body["lease"]
    assert lease["task"]["scope"] == {"targets": ["127.0.0.1"], "assets": [{"kind": "host", "value": "127.0.0.1"}]}
    assert lease["task"]["scope_ref"] is None  # nothing more to read
    assert_problem(await worker.write(lease, "scope", page=1), 422, "invalid-request")


@pytest.mark.parametrize("body", [{"page": "1"}, {"page": -1}, {"page": 1.5}, {"page": True}, {"page": 2_000_000},
                                  {"page": 1, "extra": 1}, {}])
async def test_a_malformed_page_request_is_refused(gateway: RunningGateway, body: dict[str, Any]) -> None:
    worker = await gateway.worker()
    lease = await leased(gateway, worker)
    reply = await worker.post(f"/v1/tasks/{lease['task']['id']}/attempts/{lease['attempt_id']}/scope",
                              {"lease_token": lease["lease_token"], **body})
    assert_problem(reply, 422, "validation")


async def test_a_scope_read_is_fenced_like_a_write_and_recorded_nowhere(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    lease = await leased(gateway, worker)
    other = await leased(gateway, worker)
    colleague = await gateway.worker()  # another worker of the organisation
    org = await gateway.registry.create_organization(f"other-{uuid4().hex[:8]}")
    await gateway.registry.set_target_policy(org, LOOPBACK_ALLOWED)
    stranger = await gateway.worker(org=org)  # a worker of another organisation
    path = f"/v1/tasks/{lease['task']['id']}/attempts/{lease['attempt_id']}/scope"
    events = await gateway.count("SELECT count(*) FROM events")

    assert_problem(await worker.post(path, {"lease_token": "x" * 43, "page": 1}), 409, "lease-lost")
    assert_problem(await worker.post(path, raw=b'{"lease_token": '), 400, "bad-request")
    # The same worker's ids that do not fit together, unknown ids, and ids that are not ids: one 404.
    for wrong in (f"/v1/tasks/{other['task']['id']}/attempts/{lease['attempt_id']}/scope",
                  f"/v1/tasks/{uuid4()}/attempts/{lease['attempt_id']}/scope",
                  f"/v1/tasks/{lease['task']['id']}/attempts/{uuid4()}/scope",
                  f"/v1/tasks/not-a-task/attempts/{lease['attempt_id']}/scope"):
        assert_problem(await worker.post(wrong, {"lease_token": lease["lease_token"], "page": 1}), 404, "not-found")
    # Not its attempt, even with the lease's own token; and never another organisation's scope.
    for caller in (colleague, stranger):
        assert_problem(await caller.post(path, {"lease_token": lease["lease_token"], "page": 1}), 404, "not-found")
    assert await gateway.count("SELECT count(*) FROM events") == events  # a refused read records nothing

    await gateway.lifecycle.request_cancel(UUID(lease["task"]["id"]))
    assert_problem(await worker.write(lease, "scope", page=1), 409, "task-cancelled")
    await worker.write(other, "progress")
    done = await worker.write(other, "complete", final_batch={
        "sequence_number": 1, "idempotency_key": "k1", "payload_sha256": payload_sha256([]), "payload": []})
    assert done.status == 200, done.body
    assert_problem(await worker.write(other, "scope", page=1), 409, "lease-lost")


async def test_a_stored_page_changed_in_the_database_is_never_served(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    lease = await leased(gateway, worker)
    async with gateway.pool.connection() as conn:
        cur = await conn.execute("SELECT scope_pages[2] FROM worker_tasks WHERE id = %s", (lease["task"]["id"],))
        (key,) = await cur.fetchone() or (None,)
        changed = orjson.dumps([{"kind": "service", "value": "10.6.6.6:22/tcp"}])
        await conn.execute("UPDATE scope_pages SET body = %s WHERE sha256 = %s", (changed, key))
    assert (await worker.write(lease, "scope", page=1)).status == 200
    assert_problem(await worker.write(lease, "scope", page=2), 500, "scope-damaged")


async def test_assets_past_the_scope_limit_are_counted_recorded_and_shown(
        gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A scope holds at most MAX_SCOPE_ASSETS assets (1,000,000; 5 here): the rest are left out, and
    how many is in the next task's TaskCreated, in its answers and in the Gateway's log."""
    monkeypatch.setattr("leasehold.domain.scan.MAX_SCOPE_ASSETS", 5)
    worker = await gateway.worker(task_types=("discover", "probe"))
    await gateway.scans.create_scan(gateway.org, {"targets": ["127.0.0.1"]}, profile=(
        ProfileStep(task_type="discover"), ProfileStep(task_type="probe")))
    first = (await worker.acquire()).body["lease"]
    found = [{"type": "asset", "kind": "service", "value": f"127.0.0.1:{p}/tcp"} for p in range(1, 9)]
    done = await worker.write(first, "complete", final_batch={
        "sequence_number": 1, "idempotency_key": "k1", "payload_sha256": payload_sha256(found), "payload": found})
    assert done.status == 200, done.body
    nxt = (await worker.acquire()).body["lease"]
    assert len(nxt["task"]["scope"]["assets"]) == 5 and nxt["task"]["scope_ref"]["omitted"] == 3
    task = await gateway.operator("GET", f"/v1/tasks/{nxt['task']['id']}")
    assert task.status == 200 and task.body["scope_ref"]["omitted"] == 3
    events = await gateway.operator("GET", f"/v1/tasks/{nxt['task']['id']}/events")
    assert events.body["items"][0]["payload"]["scope_assets_omitted"] == 3
    assert any(r.message.startswith("a profile step's scope is full") and r.omitted == 3  # type: ignore[attr-defined]
               for r in caplog.records)
