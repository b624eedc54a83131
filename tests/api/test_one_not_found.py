"""One 404 for ids that do not exist and ids that are someone else's: the answers are the same
bytes apart from the ids, on worker and operator routes alike, so no answer tells which ids
exist. And legacy scan ids are an organisation's own: another organisation may use the same one."""

from __future__ import annotations

import re
from uuid import uuid4

import orjson
import pytest
from test_operator_api import changes, make_tenant
from test_tenant_isolation import WRITES, send

from support.gateway import Reply, RunningGateway

UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def masked(reply: Reply) -> tuple[int, str, str]:
    """Status, content type and body (as sent: key order kept) with every id replaced: the ids
    are the only difference allowed."""
    return (reply.status, reply.headers["Content-Type"],
            UUID_TEXT.sub("<id>", orjson.dumps(reply.body).decode()).replace("not-a-uuid", "<id>"))


@pytest.mark.parametrize("action", WRITES)
async def test_worker_writes_answer_unknown_and_foreign_ids_alike(gateway: RunningGateway, action: str) -> None:
    a, b = await make_tenant(gateway), await make_tenant(gateway)
    la, lb = a.lease, b.lease
    before = await changes(gateway)
    answers = {
        "foreign task, own attempt": await send(a.worker, lb["task"]["id"], la["attempt_id"], la["lease_token"], action),
        "foreign task and attempt": await send(a.worker, lb["task"]["id"], lb["attempt_id"], lb["lease_token"], action),
        "own task, foreign attempt": await send(a.worker, la["task"]["id"], lb["attempt_id"], la["lease_token"], action),
        "unknown task": await send(a.worker, str(uuid4()), la["attempt_id"], la["lease_token"], action),
        "unknown attempt": await send(a.worker, la["task"]["id"], str(uuid4()), la["lease_token"], action),
        "malformed ids": await send(a.worker, "not-a-uuid", "not-a-uuid", la["lease_token"], action),
    }
    shapes = {name: masked(reply) for name, reply in answers.items()}
    assert len(set(shapes.values())) == 1, shapes
    status, content_type, body = next(iter(shapes.values()))
    assert status == 404 and content_type.startswith("application/problem+json")
    assert '"detail":"no such task or attempt"' in body, body
    assert await changes(gateway) == before


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/v1/tasks/{id}", None), ("POST", "/v1/tasks/{id}/cancel", {}), ("GET", "/v1/tasks/{id}/events", None),
    ("GET", "/v1/scans/{id}", None), ("POST", "/v1/scans/{id}/tasks", {"task_type": "probe"}),
    ("GET", "/v1/workers/{id}", None)])
async def test_operator_routes_answer_unknown_and_foreign_ids_alike(
        gateway: RunningGateway, method: str, path: str, body: dict[str, str] | None) -> None:
    a, b = await make_tenant(gateway), await make_tenant(gateway)
    foreign = str(b.task if "tasks/{id}" in path else b.scan if "scans" in path else b.worker_id)
    before = await changes(gateway)
    shapes = {}
    for name, id_ in (("foreign", foreign), ("unknown", str(uuid4()))):
        shapes[name] = masked(await gateway.operator(method, path.replace("{id}", id_), body, key=a.key))
    assert len(set(shapes.values())) == 1, shapes
    assert next(iter(shapes.values()))[0] == 404
    assert await changes(gateway) == before


async def test_legacy_scan_ids_are_unique_per_organisation(gateway: RunningGateway) -> None:
    a, b = await make_tenant(gateway), await make_tenant(gateway)
    for tenant in (a, b):  # the same legacy id in both: neither learns of the other's
        r = await gateway.operator("POST", "/v1/scans", {"targets": {}, "legacy_scan_id": "L-42"}, key=tenant.key)
        assert r.status == 201, r.body
    again = await gateway.operator("POST", "/v1/scans", {"targets": {}, "legacy_scan_id": "L-42"}, key=a.key)
    assert again.status == 409, again.body
    assert await gateway.count("SELECT count(DISTINCT organization_id) FROM scans WHERE legacy_scan_id = 'L-42'") == 2
