"""Tenant isolation, end to end.

Worker API: a worker of organisation A never receives organisation B's task, under many
concurrent acquires from workers of both, and cannot write to B's task by id (404, nothing
recorded) even with B's real attempt id and lease token.

Operator API: every endpoint, called with one organisation's key on another organisation's ids,
answers exactly as it does for ids that do not exist (404; administrator-only endpoints without
ids answer 403), and changes nothing.

Every endpoint has its case, read from the route tables the Gateway serves (service, worker and
operator routes): a new route without one fails ``test_every_route_has_an_isolation_case``.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any
from uuid import UUID, uuid4

import orjson
import pytest
from test_operator_api import Tenant, assert_problem, changes, make_tenant

from leasehold.gateway.api import operator as operator_api
from leasehold.gateway.api import worker as worker_api
from leasehold.gateway.api.http import listeners_of
from leasehold.gateway.api.operator import (
    ASSIGNMENT_PATH,
    PROFILE_PATH,
    SCHEDULE_PATH,
    TASK_PATH,
    WORKER_PATH,
)
from leasehold.gateway.api.operator.bulk import OPERATION_PATH as BULK_PATH
from leasehold.gateway.api.operator.webhooks import DELIVERY_PATH, WEBHOOK_PATH
from leasehold.gateway.api.service import routes as service_routes
from leasehold.gateway.api.worker import ATTEMPT_PATH
from support.gateway import RunningGateway, WorkerClient, service_get

WRITES = ("progress", "renew", "results", "complete", "fail", "cancel-ack", "scope")  # scope: a fenced read


# --- worker API -------------------------------------------------------------------------------


async def drain(worker: WorkerClient) -> list[dict[str, Any]]:
    """Acquire until nothing more is offered to this worker."""
    leases = []
    while True:
        r = await worker.acquire()
        if r.status == 204:
            return leases
        assert r.status == 200 and r.body["lease"] is not None, r.body
        leases.append(r.body["lease"])


async def test_concurrent_acquires_never_cross_organisations(gateway: RunningGateway) -> None:
    per_org, workers_per_org, loops_per_worker = 40, 3, 4
    orgs = [await gateway.registry.create_organization(f"iso-{uuid4().hex[:8]}") for _ in range(2)]
    scans = [await gateway.scans.create_scan(org, {}) for org in orgs]
    owner: dict[str, UUID] = {}
    for org, scan in zip(orgs, scans, strict=True):
        for _ in range(per_org):
            owner[str(await gateway.task(scan=scan))] = org
    workers = [(org, await gateway.worker(org=org, capacity=20)) for org in orgs for _ in range(workers_per_org)]

    # 24 acquire loops at once, both organisations' workers interleaved.
    loops = [(org, worker) for org, worker in workers for _ in range(loops_per_worker)]
    results = await asyncio.gather(*(drain(worker) for _, worker in loops))

    leased: list[str] = []
    for (org, _), leases in zip(loops, results, strict=True):
        for lease in leases:
            assert owner[lease["task"]["id"]] == org  # never another organisation's task
            leased.append(lease["task"]["id"])
    assert sorted(leased) == sorted(owner)  # every task leased, each exactly once
    # The database agrees: no attempt belongs to a worker that is not assigned to the task's org.
    assert await gateway.count("""
        SELECT count(*) FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id
        WHERE NOT EXISTS (SELECT 1 FROM organization_workers ow
                          WHERE ow.worker_id = a.worker_id AND ow.organization_id = t.organization_id)""") == 0


async def send(worker: WorkerClient, task_id: str, attempt_id: str, token: str, action: str) -> Any:
    body: dict[str, Any] = {"lease_token": token}
    if action == "results":
        body |= {"sequence_number": 1, "idempotency_key": "k", "payload": [],
                 "payload_sha256": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945", "final": True}
    elif action == "fail":
        body["error"] = "x"
    elif action == "scope":
        body["page"] = 0
    return await worker.post(f"/v1/tasks/{task_id}/attempts/{attempt_id}/{action}", body)


# Each worker route, with its rule: acquire offers only the worker's own organisations' tasks;
# every attempt write on another organisation's task or attempt answers 404 and records nothing.
OWN_TASKS_ONLY, FOREIGN_IDS_404 = "own tasks only", "foreign ids 404"
WORKER_CASES = {
    ("POST", "/v1/tasks/acquire"): OWN_TASKS_ONLY,
    **{("POST", f"{ATTEMPT_PATH}/{action}"): FOREIGN_IDS_404 for action in WRITES},
}


@pytest.mark.parametrize(("method", "path"), sorted(WORKER_CASES), ids=[f"{m} {p}" for m, p in sorted(WORKER_CASES)])
async def test_worker_routes_never_cross_organisations(gateway: RunningGateway, method: str, path: str) -> None:
    a, b = await make_tenant(gateway), await make_tenant(gateway)
    for caller, victim in ((a, b), (b, a)):
        # The victim also has a task waiting for a worker.
        r = await gateway.operator("POST", f"/v1/scans/{victim.scan}/tasks", {"task_type": "probe"}, key=victim.key)
        assert r.status == 201, r.body
        waiting = r.body["id"]
        before = await changes(gateway)
        if WORKER_CASES[(method, path)] == OWN_TASKS_ONLY:
            reply = await caller.worker.acquire()
            assert reply.status == 204, reply.body  # the caller's organisation has nothing waiting
        else:
            action = path.rsplit("/", 1)[1]
            lc, lv = caller.lease, victim.lease
            for task_id, attempt_id, token in (
                    (lv["task"]["id"], lv["attempt_id"], lv["lease_token"]),  # the victim's ids and token
                    (lv["task"]["id"], lc["attempt_id"], lc["lease_token"]),  # victim's task, own attempt
                    (lc["task"]["id"], lv["attempt_id"], lv["lease_token"]),  # own task, victim's attempt
            ):
                assert_problem(await send(caller.worker, task_id, attempt_id, token, action), 404)
        assert await changes(gateway) == before  # not even a recorded refusal
        await victim_unchanged(gateway, victim)
        assert (await gateway.operator("GET", f"/v1/tasks/{waiting}")).body["state"] == "pending"
        # The victim's own worker takes its task: it was there to take.
        assert (await victim.worker.acquire()).body["lease"]["task"]["id"] == waiting


async def test_a_worker_cannot_write_another_organisations_task_by_id(gateway: RunningGateway) -> None:
    a, b = await make_tenant(gateway), await make_tenant(gateway)
    before = await changes(gateway)
    la, lb = a.lease, b.lease
    for action in WRITES:
        for task_id, attempt_id, token in (
                (lb["task"]["id"], lb["attempt_id"], lb["lease_token"]),  # B's ids and B's (leaked) token
                (lb["task"]["id"], la["attempt_id"], la["lease_token"]),  # B's task, A's own attempt
                (la["task"]["id"], lb["attempt_id"], lb["lease_token"]),  # A's task, B's attempt
                (lb["task"]["id"], str(uuid4()), la["lease_token"]),  # B's task, a made-up attempt
        ):
            reply = await send(a.worker, task_id, attempt_id, token, action)
            assert_problem(reply, 404)
    assert await changes(gateway) == before  # not even a recorded refusal
    assert (await b.worker.write(lb, "renew")).body["task"]["state"] == "running"  # B's lease is intact


# --- operator API: every endpoint, with two organisation keys ---------------------------------

# How each endpoint must answer another organisation's key (and a valid body to send it). For
# routes with ids, the ids are the victim's; 404 must look exactly like the 404 of unknown ids.
NOT_FOUND, FORBIDDEN, OWN_ONLY = 404, 403, 200
CASES: dict[tuple[str, str], tuple[int, dict[str, Any] | None]] = {
    ("POST", "/v1/organizations"): (FORBIDDEN, {"name": "intruder"}),
    ("GET", "/v1/organizations"): (OWN_ONLY, None),
    ("GET", "/v1/organizations/{organization_id}"): (NOT_FOUND, None),
    ("POST", "/v1/organizations/{organization_id}/api-keys"): (NOT_FOUND, {"name": "intruder"}),
    ("POST", "/v1/workers"): (FORBIDDEN, {"name": "intruder", "fingerprint": "cd" * 32}),
    ("GET", "/v1/workers"): (OWN_ONLY, None),
    ("GET", WORKER_PATH): (NOT_FOUND, None),
    ("PATCH", WORKER_PATH): (NOT_FOUND, {"max_concurrent_tasks": 9}),
    ("POST", WORKER_PATH + "/enable"): (NOT_FOUND, None),
    ("POST", WORKER_PATH + "/disable"): (NOT_FOUND, None),
    ("POST", WORKER_PATH + "/revoke"): (NOT_FOUND, {}),
    ("POST", WORKER_PATH + "/assignments"): (NOT_FOUND, {"organization_id": "{organization_id}"}),
    ("DELETE", ASSIGNMENT_PATH): (NOT_FOUND, None),
    ("POST", ASSIGNMENT_PATH + "/revoke"): (NOT_FOUND, {}),
    ("POST", "/v1/scans"): (NOT_FOUND, {"organization_id": "{organization_id}", "targets": {}}),
    ("GET", "/v1/scans/{scan_id}"): (NOT_FOUND, None),
    ("POST", "/v1/scans/{scan_id}/tasks"): (NOT_FOUND, {"task_type": "probe"}),
    ("GET", TASK_PATH): (NOT_FOUND, None),
    ("POST", TASK_PATH + "/cancel"): (NOT_FOUND, {}),
    ("GET", TASK_PATH + "/events"): (NOT_FOUND, None),
    ("POST", "/v1/scans/{scan_id}/cancel"): (NOT_FOUND, {}),
    ("GET", "/v1/scans/{scan_id}/assets"): (NOT_FOUND, None),
    ("GET", "/v1/organizations/{organization_id}/assets"): (NOT_FOUND, None),
    ("GET", "/v1/organizations/{organization_id}/threats"): (NOT_FOUND, None),
    ("POST", "/v1/schedules"): (NOT_FOUND, {"organization_id": "{organization_id}", "name": "intruder",
                                            "interval_seconds": 3600, "profile": [{"task_type": "probe"}]}),
    ("GET", "/v1/schedules"): (OWN_ONLY, None),
    ("GET", SCHEDULE_PATH): (NOT_FOUND, None),
    ("DELETE", SCHEDULE_PATH): (NOT_FOUND, None),
    ("POST", SCHEDULE_PATH + "/pause"): (NOT_FOUND, None),
    ("POST", SCHEDULE_PATH + "/resume"): (NOT_FOUND, None),
    ("POST", SCHEDULE_PATH + "/run-now"): (NOT_FOUND, None),
    ("POST", "/v1/profiles"): (NOT_FOUND, {"organization_id": "{organization_id}", "name": "intruder",
                                           "steps": [{"task_type": "probe"}]}),
    ("GET", "/v1/profiles"): (OWN_ONLY, None),
    ("GET", PROFILE_PATH): (NOT_FOUND, None),
    ("PUT", PROFILE_PATH): (NOT_FOUND, {"steps": [{"task_type": "probe"}]}),
    ("PUT", PROFILE_PATH + "/gateway-execution"): (NOT_FOUND, {"enabled": False}),
    ("DELETE", PROFILE_PATH): (NOT_FOUND, None),
    ("PUT", "/v1/organizations/{organization_id}/gateway-execution"): (NOT_FOUND, {"enabled": False}),
    ("GET", "/v1/organizations/{organization_id}/fair-share"): (NOT_FOUND, None),
    ("PUT", "/v1/organizations/{organization_id}/fair-share"): (NOT_FOUND, {"weight": 9, "max_live_attempts": 1}),
    ("GET", "/v1/organizations/{organization_id}/admission"): (NOT_FOUND, None),
    ("PUT", "/v1/organizations/{organization_id}/admission"): (NOT_FOUND, {"max_queued_tasks": 0,
                                                                       "max_queued_scans": 0, "reason": "x"}),
    ("POST", "/v1/scans/{scan_id}/legacy-status"): (NOT_FOUND, {"status": "running"}),
    ("GET", "/v1/scans"): (OWN_ONLY, None),
    ("GET", "/v1/scans/{scan_id}/detail"): (NOT_FOUND, None),
    ("GET", "/v1/tasks"): (OWN_ONLY, None),
    ("GET", "/v1/counts"): (OWN_ONLY, None),
    ("POST", TASK_PATH + "/retry"): (NOT_FOUND, {}),
    # Administrator only: an organisation key is refused before any id is read.
    ("GET", "/v1/api-keys"): (FORBIDDEN, None),
    ("POST", "/v1/api-keys"): (FORBIDDEN, {"organization_id": "{organization_id}", "name": "intruder"}),
    ("GET", "/v1/api-keys/{key_id}"): (FORBIDDEN, None),
    ("POST", "/v1/api-keys/{key_id}/revoke"): (FORBIDDEN, None),
    ("POST", "/v1/api-keys/{key_id}/rotate"): (FORBIDDEN, {}),
    ("POST", "/v1/seals"): (FORBIDDEN, None),
    ("POST", "/v1/bulk-previews"): (NOT_FOUND, {"action": "cancel", "filter": {"organization_id": "{organization_id}"}}),
    ("POST", "/v1/bulk-operations"): (NOT_FOUND, {"action": "cancel",
                                                  "filter": {"organization_id": "{organization_id}"}}),
    ("GET", "/v1/bulk-operations"): (OWN_ONLY, None),
    ("GET", BULK_PATH): (NOT_FOUND, None),
    ("GET", BULK_PATH + "/tasks"): (NOT_FOUND, None),
    ("POST", BULK_PATH + "/stop"): (NOT_FOUND, None),
    ("POST", "/v1/webhooks"): (NOT_FOUND, {"organization_id": "{organization_id}", "url": "http://127.0.0.1:9/x"}),
    ("GET", "/v1/webhooks"): (OWN_ONLY, None),
    ("GET", WEBHOOK_PATH): (NOT_FOUND, None),
    ("DELETE", WEBHOOK_PATH): (NOT_FOUND, None),
    ("GET", WEBHOOK_PATH + "/deliveries"): (NOT_FOUND, None),
    ("POST", DELIVERY_PATH + "/redeliver"): (NOT_FOUND, None),
    ("POST", WEBHOOK_PATH + "/test"): (NOT_FOUND, None),
    ("GET", "/v1/organizations/{organization_id}/target-policy"): (NOT_FOUND, None),
    ("PUT", "/v1/organizations/{organization_id}/target-policy"): (NOT_FOUND, {"deny": ["10.0.0.0/8"]}),
}
ROUTES = [(r.method, r.path) for r in operator_api.routes]
#: Service endpoints answer anyone, and say nothing about any organisation.
SERVICE_ROUTES = [(r.method, r.path) for r in service_routes]
UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_every_route_has_an_isolation_case() -> None:
    """The route tables are what the Gateway serves (``gateway.app.create_app``)."""
    assert sorted(CASES) == sorted(ROUTES)
    assert sorted(WORKER_CASES) == sorted((r.method, r.path) for r in worker_api.routes)
    assert {r.auth for r in service_routes} == {"none"}


@pytest.mark.parametrize(("method", "path"), SERVICE_ROUTES, ids=[f"{m} {p}" for m, p in SERVICE_ROUTES])
async def test_service_routes_show_no_organisation(gateway: RunningGateway, method: str, path: str) -> None:
    a = await make_tenant(gateway)
    route = next(r for r in service_routes if (r.method, r.path) == (method, path))
    if "worker" in listeners_of(route):
        async with a.worker.session.request(method, a.worker.base + path) as r:
            text = await r.text()
            status = r.status
    else:  # the operator port's (metrics): anyone who reaches it, no key
        reply = await service_get(gateway.pki, gateway.operator_url + path)
        text, status = str(reply.body), reply.status
    assert status == 200
    assert not any(v in text for v in (*ids_of(a).values(), str(gateway.org), a.key))


#: Each tenant's scheduled scan and stored profile (made for those routes' cases), by organisation.
SCHEDULES: dict[UUID, UUID] = {}
PROFILES: dict[UUID, UUID] = {}
BULKS: dict[UUID, UUID] = {}
WEBHOOKS: dict[UUID, tuple[UUID, UUID]] = {}


async def add_schedule(gateway: RunningGateway, t: Tenant) -> None:
    r = await gateway.operator("POST", "/v1/schedules", {"name": "nightly", "interval_seconds": 86400,
                                                         "profile": [{"task_type": "probe"}]}, key=t.key)
    assert r.status == 201, r.body
    SCHEDULES[t.org] = UUID(r.body["id"])


async def add_profile(gateway: RunningGateway, t: Tenant) -> None:
    r = await gateway.operator("POST", "/v1/profiles", {"name": "own", "steps": [{"task_type": "probe"}]},
                               key=t.key)
    assert r.status == 201, r.body
    PROFILES[t.org] = UUID(r.body["id"])


async def add_bulk(gateway: RunningGateway, t: Tenant) -> None:
    """An operation of the tenant's own (over its cancelled tasks: none, so it changes nothing)."""
    r = await gateway.operator("POST", "/v1/bulk-operations", {"action": "cancel", "filter": {"state": "cancelled"}},
                               key=t.key)
    assert r.status == 202, r.body
    BULKS[t.org] = UUID(r.body["id"])


async def add_webhook(gateway: RunningGateway, t: Tenant) -> None:
    """A subscription of the tenant's own, and a delivery of it (a test ping)."""
    r = await gateway.operator("POST", "/v1/webhooks", {"url": "http://127.0.0.1:9/hook"}, key=t.key)
    assert r.status == 201, r.body
    ping = await gateway.operator("POST", f"/v1/webhooks/{r.body['id']}/test", None, key=t.key)
    assert ping.status == 202, ping.body
    WEBHOOKS[t.org] = (UUID(r.body["id"]), UUID(ping.body["id"]))


def ids_of(t: Tenant) -> dict[str, str]:
    return {"organization_id": str(t.org), "worker_id": str(t.worker_id), "scan_id": str(t.scan),
            "task_id": str(t.task), "schedule_id": str(SCHEDULES.get(t.org, uuid4())),
            "profile_id": str(PROFILES.get(t.org, uuid4())), "operation_id": str(BULKS.get(t.org, uuid4())),
            "webhook_id": str(WEBHOOKS.get(t.org, (uuid4(), uuid4()))[0]),
            "delivery_id": str(WEBHOOKS.get(t.org, (uuid4(), uuid4()))[1]),
            "key_id": str(uuid4())}  # (key routes are for administrators: refused before the id is read)


def fill(template: str, ids: dict[str, str]) -> str:
    return re.sub(r"{(\w+)(?::[^{}/]*)?}", lambda m: ids[m.group(1)], template)


def fill_body(body: dict[str, Any] | None, ids: dict[str, str]) -> dict[str, Any] | None:
    if body is None:
        return None
    return {k: fill(v, ids) if isinstance(v, str) else fill_body(v, ids) if isinstance(v, dict) else v
            for k, v in body.items()}


def masked(reply: Any) -> bytes:
    return UUID_TEXT.sub("<id>", orjson.dumps(reply.body).decode()).encode()


async def victim_unchanged(gateway: RunningGateway, victim: Tenant) -> None:
    r = await gateway.operator("GET", f"/v1/tasks/{victim.task}")
    assert r.body["state"] == "running" and r.body["cancel_requested_at"] is None
    w = (await gateway.operator("GET", f"/v1/workers/{victim.worker_id}")).body
    assert w["enabled"] and w["revoked_at"] is None and w["max_concurrent_tasks"] == 4
    assert [a["state"] for a in w["assignments"]] == ["active"]


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
async def test_organisation_keys_never_cross_organisations(gateway: RunningGateway, method: str,
                                                           path: str) -> None:
    expected, body = CASES[(method, path)]
    a, b = await make_tenant(gateway), await make_tenant(gateway)
    if "schedule" in path:
        for t in (a, b):
            await add_schedule(gateway, t)
    if "profile" in path:
        for t in (a, b):
            await add_profile(gateway, t)
    if "bulk" in path:
        for t in (a, b):
            await add_bulk(gateway, t)
    if "webhook" in path:
        for t in (a, b):
            await add_webhook(gateway, t)
    for caller, victim in ((a, b), (b, a)):
        before = await changes(gateway)
        foreign = await gateway.operator(method, fill(path, ids_of(victim)), fill_body(body, ids_of(victim)),
                                         key=caller.key)
        if expected == OWN_ONLY:
            assert foreign.status == 200
            text = orjson.dumps(foreign.body).decode()
            assert str(caller.org) in text and not any(v in text for v in ids_of(victim).values())
        else:
            assert_problem(foreign, expected)
            if expected == NOT_FOUND:
                unknown = {name: str(uuid4()) for name in ids_of(victim)}
                nowhere = await gateway.operator(method, fill(path, unknown), fill_body(body, unknown),
                                                 key=caller.key)
                assert (nowhere.status, masked(nowhere)) == (foreign.status, masked(foreign))
        if "{worker_id}" in path or path == WORKER_PATH + "/assignments":
            # Mixed: the caller's own worker with the victim's organisation.
            mixed = {**ids_of(caller), "organization_id": str(victim.org)}
            if "{organization_id}" in path or body and "organization_id" in body:
                assert_problem(await gateway.operator(method, fill(path, mixed), fill_body(body, mixed),
                                                      key=caller.key), 404)
        assert await changes(gateway) == before
        await victim_unchanged(gateway, victim)
