"""The operator API over real HTTPS against a real Gateway and PostgreSQL: organisations and
keys, workers and assignments, scans and tasks, task histories, the OpenAPI document, the admin
CLI, and bad input (4xx problem+json, nothing changes)."""

from __future__ import annotations

import asyncio
import contextlib
import io
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

import orjson
import pytest

from leasehold.gateway.api import operator as operator_api
from support.gateway import ADMIN_KEY, Reply, RunningGateway, WorkerClient

# --- helpers (also used by test_revocation and test_tenant_isolation) -------------------------


def assert_problem(reply: Reply, status: int) -> None:
    assert reply.status == status, (reply.status, reply.body)
    assert reply.headers["Content-Type"].startswith("application/problem+json"), reply.headers
    assert {"type", "title", "status", "detail"} <= set(reply.body) and reply.body["status"] == status


async def changes(gateway: RunningGateway) -> tuple[int, int]:
    """What a refused request must leave alone: the event log and the stored API keys."""
    return (int(await gateway.count("SELECT count(*) FROM events")),
            int(await gateway.count("SELECT count(*) FROM api_keys")))


async def raw_operator(gateway: RunningGateway, method: str, path: str, raw: bytes, *,
                       key: str = ADMIN_KEY) -> Reply:
    """Like ``gateway.operator`` but with a body sent verbatim (malformed JSON and the like)."""
    import ssl

    import aiohttp

    ctx = ssl.create_default_context(cafile=str(gateway.pki.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, s.request(
            method, gateway.operator_url + path, data=raw,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}) as r:
        text = await r.read()
        return Reply(r.status, orjson.loads(text) if text else None, dict(r.headers))


@dataclass
class Tenant:
    """One organisation set up through the operator API, with a worker holding a running task."""

    org: UUID
    key: str
    scan: UUID
    task: UUID
    worker: WorkerClient
    lease: dict[str, Any]

    @property
    def worker_id(self) -> UUID:
        return self.worker.id


async def make_tenant(gateway: RunningGateway, name: str | None = None) -> Tenant:
    name = name or f"tenant-{uuid4().hex[:8]}"
    r = await gateway.operator("POST", "/v1/organizations", {"name": name})
    assert r.status == 201, r.body
    org = UUID(r.body["id"])
    r = await gateway.operator("POST", f"/v1/organizations/{org}/api-keys", {"name": f"{name} key"})
    assert r.status == 201, r.body
    key = r.body["key"]
    r = await gateway.operator("POST", "/v1/scans", {"targets": {"hosts": [name]}}, key=key)
    assert r.status == 201, r.body
    scan = UUID(r.body["id"])
    r = await gateway.operator("POST", f"/v1/scans/{scan}/tasks", {"task_type": "probe"}, key=key)
    assert r.status == 201, r.body
    task = UUID(r.body["id"])
    worker = await gateway.worker(org=org)
    r = await worker.acquire()
    assert r.status == 200 and r.body["lease"]["task"]["id"] == str(task), r.body
    lease = r.body["lease"]
    assert (await worker.write(lease, "progress")).status == 200
    return Tenant(org, key, scan, task, worker, lease)


# --- organisations and keys -------------------------------------------------------------------


async def test_organisations_are_created_listed_by_page_and_scoped_to_their_keys(gateway: RunningGateway) -> None:
    created = []
    for i in range(3):
        r = await gateway.operator("POST", "/v1/organizations", {"name": f"org {i}"})
        assert r.status == 201 and r.body["name"] == f"org {i}"
        created.append(r.body["id"])
    assert_problem(await gateway.operator("POST", "/v1/organizations", {"name": "org 0"}), 409)  # unique

    seen, after = [], None
    while True:
        r = await gateway.operator("GET", "/v1/organizations?limit=2" + (f"&after={after}" if after else ""))
        assert r.status == 200 and len(r.body["items"]) <= 2
        seen += [o["id"] for o in r.body["items"]]
        after = r.body["next_after"]
        if after is None:
            break
    assert sorted(seen) == seen and set(seen) == {*created, str(gateway.org)}  # id order, every one once

    r = await gateway.operator("POST", f"/v1/organizations/{created[0]}/api-keys", {"name": "ci"})
    assert r.status == 201 and r.body["organization_id"] == created[0] and r.body["key"].startswith("lh_")
    key = r.body["key"]
    r = await gateway.operator("GET", "/v1/organizations", key=key)
    assert [o["id"] for o in r.body["items"]] == [created[0]] and r.body["next_after"] is None
    assert (await gateway.operator("GET", f"/v1/organizations/{created[0]}", key=key)).body["name"] == "org 0"
    assert_problem(await gateway.operator("GET", f"/v1/organizations/{created[1]}", key=key), 404)
    assert_problem(await gateway.operator("POST", "/v1/organizations", {"name": "mine"}, key=key), 403)
    assert_problem(await gateway.operator("POST", f"/v1/organizations/{created[0]}/api-keys", {"name": "x"},
                                          key=key), 403)


async def test_missing_or_unknown_keys_are_401(gateway: RunningGateway) -> None:
    assert_problem(await gateway.operator("GET", "/v1/organizations", key="not-a-key"), 401)
    import ssl

    import aiohttp

    ctx = ssl.create_default_context(cafile=str(gateway.pki.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, \
            s.get(gateway.operator_url + "/v1/workers") as r:
        assert r.status == 401 and r.headers["Content-Type"].startswith("application/problem+json")


# --- workers and assignments ------------------------------------------------------------------


async def test_worker_registration_update_and_enable_disable(gateway: RunningGateway) -> None:
    worker = await gateway.worker(register=False)
    body = {"name": "scanner-1", "fingerprint": worker.fingerprint.upper(), "capabilities": ["ipv6", "ipv4"],
            "task_types": ["probe"], "max_concurrent_tasks": 2}
    r = await gateway.operator("POST", "/v1/workers", body)
    assert r.status == 201, r.body
    worker.id = UUID(r.body["id"])
    assert r.body["fingerprint"] == worker.fingerprint and r.body["capabilities"] == ["ipv4", "ipv6"]
    assert r.body["enabled"] is True and r.body["revoked_at"] is None and r.body["assignments"] == []
    assert_problem(await gateway.operator("POST", "/v1/workers", {**body, "name": "dup"}), 409)

    assert (await worker.acquire()).status == 204  # registered, but assigned nowhere yet
    r = await gateway.operator("POST", f"/v1/workers/{worker.id}/assignments", {"organization_id": str(gateway.org)})
    assert r.status == 200 and [a["state"] for a in r.body["assignments"]] == ["active"]
    again = await gateway.operator("POST", f"/v1/workers/{worker.id}/assignments",
                                   {"organization_id": str(gateway.org)})
    assert again.body == r.body  # repeating it changes nothing

    r = await gateway.operator("PATCH", f"/v1/workers/{worker.id}", {"task_types": ["probe", "dns"],
                                                                     "max_concurrent_tasks": 5})
    assert r.status == 200 and r.body["task_types"] == ["dns", "probe"] and r.body["max_concurrent_tasks"] == 5
    assert r.body["capabilities"] == ["ipv4", "ipv6"]  # untouched

    await gateway.task(task_type="dns")
    r = await gateway.operator("POST", f"/v1/workers/{worker.id}/disable")
    assert r.status == 200 and r.body["enabled"] is False
    assert_problem(await worker.acquire(), 403)
    r = await gateway.operator("POST", f"/v1/workers/{worker.id}/enable")
    assert r.status == 200 and r.body["enabled"] is True
    r = await worker.acquire()
    assert r.status == 200 and r.body["lease"]["task"]["task_type"] == "dns"  # the new task type took effect


async def test_worker_listing_is_paged_and_organisation_keys_see_only_their_assignments(
        gateway: RunningGateway) -> None:
    a, b = await make_tenant(gateway), await make_tenant(gateway)
    shared = await gateway.worker(org=a.org)
    await gateway.operator("POST", f"/v1/workers/{shared.id}/assignments", {"organization_id": str(b.org)})

    ids, after = [], None
    while True:
        r = await gateway.operator("GET", "/v1/workers?limit=1" + (f"&after={after}" if after else ""))
        ids += [w["id"] for w in r.body["items"]]
        after = r.body["next_after"]
        if after is None:
            break
    assert set(ids) == {str(a.worker_id), str(b.worker_id), str(shared.id)} and len(ids) == 3

    r = await gateway.operator("GET", "/v1/workers", key=a.key)
    assert {w["id"] for w in r.body["items"]} == {str(a.worker_id), str(shared.id)}
    view = (await gateway.operator("GET", f"/v1/workers/{shared.id}", key=a.key)).body
    assert [x["organization_id"] for x in view["assignments"]] == [str(a.org)]  # never b's
    admin_view = (await gateway.operator("GET", f"/v1/workers/{shared.id}")).body
    assert {x["organization_id"] for x in admin_view["assignments"]} == {str(a.org), str(b.org)}
    assert_problem(await gateway.operator("GET", f"/v1/workers/{b.worker_id}", key=a.key), 404)
    # Visible, but administrator-only: 403 (it already knows this worker exists).
    assert_problem(await gateway.operator("POST", f"/v1/workers/{a.worker_id}/disable", key=a.key), 403)


# --- scans, tasks and their history -----------------------------------------------------------


async def test_task_created_read_cancelled_and_audited_through_the_api(gateway: RunningGateway) -> None:
    a = await make_tenant(gateway)
    spec = {"task_type": "probe", "plugin": "nmap", "required_capabilities": [], "priority": 7,
            "scope": {"hosts": ["10.0.0.1"]}, "parameters": {"ports": "1-1024"}, "max_attempts": 2,
            "lease_seconds": 30, "execution_timeout_seconds": 600}
    r = await gateway.operator("POST", f"/v1/scans/{a.scan}/tasks", spec, key=a.key)
    assert r.status == 201, r.body
    task = r.body
    assert task["state"] == "pending" and task["organization_id"] == str(a.org) and task["attempts"] == []
    assert {k: task[k] for k in spec if k != "plugin"} == {k: v for k, v in spec.items() if k != "plugin"}

    # The tenant's worker holds one lease already (capacity 4): it takes this one too.
    lease = (await a.worker.acquire()).body["lease"]
    assert lease["task"]["id"] == task["id"]
    r = await gateway.operator("GET", f"/v1/tasks/{task['id']}", key=a.key)
    assert r.status == 200 and r.body["state"] == "leased"
    (attempt,) = r.body["attempts"]
    assert attempt["id"] == lease["attempt_id"] and attempt["worker_id"] == str(a.worker_id)
    assert r.body["current_attempt_id"] == lease["attempt_id"]

    r = await gateway.operator("POST", f"/v1/tasks/{task['id']}/cancel", {"reason": "not needed"}, key=a.key)
    assert r.status == 200 and r.body["state"] == "cancelling" and r.body["cancel_requested_at"]
    assert (r.body["cancel_delivered_at"], r.body["cancel_delivery_channel"]) == (None, None)  # not told yet
    assert (await gateway.operator("POST", f"/v1/tasks/{task['id']}/cancel", {}, key=a.key)).body["state"] \
        == "cancelling"  # repeated cancel is a no-op
    renewed = await a.worker.write(lease, "renew")
    assert renewed.status == 200 and renewed.body["cancel_requested"] is True
    assert (await a.worker.write(lease, "cancel-ack")).body["task"]["state"] == "cancelled"
    r = await gateway.operator("GET", f"/v1/tasks/{task['id']}", key=a.key)
    assert r.body["state"] == "cancelled" and r.body["attempts"][0]["status"] == "cancelled"
    assert r.body["cancel_delivery_channel"] == "renew" and r.body["cancel_delivered_at"]

    r = await gateway.operator("GET", f"/v1/tasks/{task['id']}/events", key=a.key)
    assert r.status == 200 and r.body["next_after_version"] is None
    events = r.body["items"]
    # A renewal while cancelling extends nothing; it records only that the cancel was handed over.
    assert [e["type"] for e in events] == ["TaskCreated", "TaskLeased", "CancelRequested", "CancelDelivered",
                                           "TaskCancelled"]
    assert [e["version"] for e in events] == [1, 2, 3, 4, 5]
    created, leased, cancel, delivered, _ = events
    assert delivered["payload"] == {"attempt_id": lease["attempt_id"], "channel": "renew"}
    assert created["actor"].startswith("operator:") and created["payload"]["scope"] == spec["scope"]
    assert leased["actor"] == f"worker:{a.worker.fingerprint}"
    assert leased["payload"]["attempt_id"] == lease["attempt_id"]
    assert cancel["payload"] == {"reason": "not needed"} and cancel["topic"] == "domain.events:CancelRequested"
    assert all(e["recorded_at"] and e["occurred_at"] for e in events)

    page = await gateway.operator("GET", f"/v1/tasks/{task['id']}/events?limit=3", key=a.key)
    assert [e["version"] for e in page.body["items"]] == [1, 2, 3] and page.body["next_after_version"] == 3
    rest = await gateway.operator("GET", f"/v1/tasks/{task['id']}/events?after_version=3", key=a.key)
    assert [e["version"] for e in rest.body["items"]] == [4, 5] and rest.body["next_after_version"] is None

    scan = await gateway.operator("GET", f"/v1/scans/{a.scan}", key=a.key)
    assert scan.status == 200 and scan.body["organization_id"] == str(a.org)


async def test_task_history_never_shows_lease_tokens_or_their_hashes(gateway: RunningGateway) -> None:
    import hashlib

    worker = await gateway.worker()
    task = await gateway.task()
    first = (await worker.acquire(request_id="req-1")).body["lease"]
    second = (await worker.acquire(request_id="req-1")).body["lease"]  # same attempt, fresh token
    assert first["attempt_id"] == second["attempt_id"] and first["lease_token"] != second["lease_token"]
    r = await gateway.operator("GET", f"/v1/tasks/{task}/events")
    assert [e["type"] for e in r.body["items"]] == ["TaskCreated", "TaskLeased", "LeaseReissued"]
    raw = orjson.dumps(r.body).decode() + orjson.dumps(
        (await gateway.operator("GET", f"/v1/tasks/{task}")).body).decode()
    assert "lease_token" not in raw
    for lease in (first, second):
        assert lease["lease_token"] not in raw
        assert hashlib.sha256(lease["lease_token"].encode()).hexdigest() not in raw
    # The stored event still has the hash (the log is for the replay tools); only the API hides it.
    assert await gateway.count("SELECT count(*) FROM events WHERE convert_from(state, 'UTF8') LIKE"
                               " '%%lease_token_hash%%'") == 2


async def test_scans_need_an_organisation_and_reject_legacy_and_unknown_ones(gateway: RunningGateway) -> None:
    assert_problem(await gateway.operator("POST", "/v1/scans", {"targets": {}}), 422)  # admin: which org?
    assert_problem(await gateway.operator("POST", "/v1/scans", {"organization_id": str(uuid4())}), 404)
    r = await gateway.operator("POST", "/v1/scans", {"organization_id": str(gateway.org), "targets": {"a": 1}})
    assert r.status == 201 and r.body["status"] == "pending" and r.body["execution_mode"] == "gateway"
    legacy = await gateway.scans.create_scan(gateway.org, {}, execution_mode="legacy")
    assert_problem(await gateway.operator("POST", f"/v1/scans/{legacy}/tasks", {"task_type": "probe"}), 409)


# --- the OpenAPI document and the admin CLI ---------------------------------------------------


async def test_openapi_documents_every_operator_route(gateway: RunningGateway) -> None:
    doc = (await gateway.operator("GET", "/openapi.json")).body
    import re

    for route in operator_api.routes:
        path = re.sub(r"{(\w+):[^{}/]*}", r"{\1}", route.path)
        op = doc["paths"][path][route.method.lower()]
        assert op["tags"] == ["operator"] and op["security"] == [{"bearer": []}], (route.method, path)
        assert {"401", "403", "404"} <= set(op["responses"])
        assert [p["name"] for p in op.get("parameters", []) if p["in"] == "path"] == re.findall(r"{(\w+)", route.path)
        if route.request is not None:
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/" + route.request.__name__)
        assert route.response is not None and route.response.__name__ in doc["components"]["schemas"]
    # The task routes' UUID pattern keeps the worker route's method check intact.
    worker = await gateway.worker()
    async with worker.session.get(worker.base + "/v1/tasks/acquire") as r:
        assert r.status == 405


async def test_admin_cli_creates_a_key_that_works_and_prints_it_once(gateway: RunningGateway) -> None:
    from leasehold.cli.main import main

    url = gateway.settings.database_url
    assert url is not None

    def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["admin", "create-key", "--database-url", url, *argv])
        return code, out.getvalue(), err.getvalue()

    code, out, err = await asyncio.to_thread(run, "--organization", str(gateway.org), "--name", "ci")
    assert code == 0 and "shown only once" in err
    key = out.strip()
    assert key.startswith("lh_") and key not in err
    r = await gateway.operator("GET", "/v1/organizations", key=key)
    assert [o["id"] for o in r.body["items"]] == [str(gateway.org)]
    assert await gateway.count("SELECT count(*) FROM api_keys WHERE name = 'ci'") == 1

    code, out, _ = await asyncio.to_thread(run)  # an administrator key
    assert code == 0
    assert (await gateway.operator("POST", "/v1/organizations", {"name": "by cli admin"}, key=out.strip())).status == 201

    before = await changes(gateway)
    assert (await asyncio.to_thread(run, "--organization", "nope"))[0] == 2
    assert (await asyncio.to_thread(run, "--organization", str(uuid4())))[0] == 1
    assert await changes(gateway) == before


# --- bad input --------------------------------------------------------------------------------

# An id nothing has (fixed, so every pytest-xdist process collects the same test ids).
UNKNOWN = UUID("5e1f0000-0000-4000-8000-00000000dead")

# (method, path, raw body or JSON body, status). Paths name {org}, {worker}, {scan}, {task}.
BAD_INPUT: list[tuple[str, str, bytes | dict[str, Any] | None, int]] = [
    ("POST", "/v1/organizations", b"{not json", 400),
    ("POST", "/v1/organizations", b"[]", 400),
    ("POST", "/v1/organizations", {"name": 5}, 422),
    ("POST", "/v1/organizations", {"name": ""}, 422),
    ("POST", "/v1/organizations", {"name": "x", "id": str(UNKNOWN)}, 422),
    ("POST", "/v1/organizations", {}, 422),
    ("POST", "/v1/organizations", b'{"name": "' + b"x" * (5 * 1024 * 1024) + b'"}', 413),
    ("POST", "/v1/organizations/{org}/api-keys", {"name": "k", "organization_id": None}, 422),
    ("POST", "/v1/organizations/{org}/api-keys", b"\xff\xfe", 400),
    ("POST", f"/v1/organizations/{UNKNOWN}/api-keys", {"name": "k"}, 404),
    ("POST", "/v1/organizations/not-an-id/api-keys", {"name": "k"}, 404),
    ("GET", "/v1/organizations?limit=0", None, 422),
    ("GET", "/v1/organizations?limit=many", None, 422),
    ("GET", "/v1/organizations?after=zzz", None, 422),
    ("GET", "/v1/organizations?color=blue", None, 422),
    ("GET", f"/v1/organizations/{UNKNOWN}", None, 404),
    ("POST", "/v1/workers", {"name": "w", "fingerprint": "zz" * 32}, 422),
    ("POST", "/v1/workers", {"name": "w", "fingerprint": "ab" * 32, "max_concurrent_tasks": "2"}, 422),
    ("POST", "/v1/workers", {"name": "w", "fingerprint": "ab" * 32, "max_concurrent_tasks": 0}, 422),
    ("POST", "/v1/workers", {"name": "w", "fingerprint": "ab" * 32, "capabilities": "ipv4"}, 422),
    ("POST", "/v1/workers", {"name": "w", "fingerprint": "ab" * 32, "capabilities": [" x"]}, 422),
    ("POST", "/v1/workers", {"name": "w", "fingerprint": "ab" * 32, "organization_id": str(UNKNOWN)}, 422),
    ("PATCH", "/v1/workers/{worker}", {}, 422),
    ("PATCH", "/v1/workers/{worker}", {"max_concurrent_tasks": True}, 422),
    ("PATCH", "/v1/workers/{worker}", {"enabled": False}, 422),
    ("PATCH", f"/v1/workers/{UNKNOWN}", {"max_concurrent_tasks": 3}, 404),
    ("POST", "/v1/workers/{worker}/revoke", {"reason": ""}, 422),
    ("POST", "/v1/workers/{worker}/revoke", b"{", 400),
    ("POST", f"/v1/workers/{UNKNOWN}/revoke", {}, 404),
    ("POST", f"/v1/workers/{UNKNOWN}/disable", None, 404),
    ("POST", "/v1/workers/{worker}/assignments", {"organization_id": "nope"}, 422),
    ("POST", "/v1/workers/{worker}/assignments", {"organization_id": str(UNKNOWN)}, 404),
    ("POST", "/v1/workers/{worker}/assignments", {}, 422),
    ("DELETE", "/v1/workers/{worker}/assignments/{org}?finish_active=maybe", None, 422),
    ("DELETE", f"/v1/workers/{{worker}}/assignments/{UNKNOWN}", None, 404),
    ("POST", "/v1/workers/{worker}/assignments/{org}/revoke", {"reason": 1}, 422),
    ("POST", "/v1/scans", {"organization_id": "{org}", "targets": []}, 422),
    ("POST", "/v1/scans", {"organization_id": "{org}", "targets": {}, "status": "running"}, 422),
    ("POST", "/v1/scans/{scan}/tasks", {"task_type": ""}, 422),
    ("POST", "/v1/scans/{scan}/tasks", {"task_type": "probe", "max_attempts": 0}, 422),
    ("POST", "/v1/scans/{scan}/tasks", {"task_type": "probe", "lease_seconds": 3601}, 422),
    ("POST", "/v1/scans/{scan}/tasks", {"task_type": "probe", "priority": "high"}, 422),
    ("POST", "/v1/scans/{scan}/tasks", {"task_type": "probe", "scope": ["x"]}, 422),
    ("POST", "/v1/scans/{scan}/tasks", {"task_type": "probe", "organization_id": "{org}"}, 422),
    ("POST", f"/v1/scans/{UNKNOWN}/tasks", {"task_type": "probe"}, 404),
    ("POST", "/v1/tasks/{task}/cancel", {"reason": ["x"]}, 422),
    ("POST", "/v1/tasks/{task}/cancel", b"nul", 400),
    ("POST", f"/v1/tasks/{UNKNOWN}/cancel", {}, 404),
    ("POST", "/v1/tasks/not-a-uuid/cancel", {}, 404),
    ("GET", f"/v1/tasks/{UNKNOWN}", None, 404),
    ("GET", "/v1/tasks/{task}/events?after_version=-1", None, 422),
    ("GET", "/v1/tasks/{task}/events?after_version=9223372036854775808", None, 422),
    ("GET", "/v1/tasks/{task}/events?limit=100000", None, 422),
]


@pytest.mark.parametrize(("method", "path", "body", "status"), BAD_INPUT,
                         ids=[f"{m} {p} {s}" for m, p, _, s in BAD_INPUT])
async def test_bad_input_is_a_4xx_problem_and_changes_nothing(gateway: RunningGateway, method: str, path: str,
                                                              body: bytes | dict[str, Any] | None,
                                                              status: int) -> None:
    worker = await gateway.worker()
    task = await gateway.task()
    ids = {"{org}": str(gateway.org), "{worker}": str(worker.id), "{scan}": str(gateway.scan),
           "{task}": str(task)}
    for name, value in ids.items():
        path = path.replace(name, value)
    if isinstance(body, dict):
        body = {k: ids.get(v, v) if isinstance(v, str) else v for k, v in body.items()}
    before = await changes(gateway)
    if isinstance(body, bytes):
        reply = await raw_operator(gateway, method, path, body)
    else:
        reply = await gateway.operator(method, path, body)
    assert_problem(reply, status)
    assert await changes(gateway) == before
