"""Rules of the API's input that no schema states, each found by fuzzing the Gateway
(``test_schemathesis``) as a 500 or as a request the OpenAPI document and the Gateway disagreed
on. Bad input gets 4xx ``application/problem+json`` and changes nothing."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from leasehold.domain.errors import Conflict
from leasehold.domain.results import payload_sha256
from leasehold.gateway.commands.registry import Registry
from leasehold.persistence.connection import create_pool
from leasehold.persistence.transaction import Database
from support.gateway import RunningGateway, WorkerClient


async def events(gateway: RunningGateway) -> int:
    return int(await gateway.count("SELECT count(*) FROM events"))


def assert_problem(reply: Any, status: int) -> None:
    assert reply.status == status, (reply.status, reply.body)
    assert reply.headers["Content-Type"].startswith("application/problem+json")
    assert reply.body["status"] == status


async def leased(gateway: RunningGateway) -> tuple[WorkerClient, dict[str, Any]]:
    worker = await gateway.worker()
    await gateway.task()
    lease = (await worker.acquire()).body["lease"]
    assert (await worker.write(lease, "progress")).status == 200
    return worker, lease


# --- NUL: PostgreSQL text cannot hold it (found as a 500 on an idempotency key) ----------------


@pytest.mark.parametrize("where", ["idempotency_key", "payload value", "payload key"])
async def test_nul_in_a_result_batch_is_422(gateway: RunningGateway, where: str) -> None:
    worker, lease = await leased(gateway)
    key, records = "k1", [{"type": "raw", "text": "fine"}]
    if where == "idempotency_key":
        key = "k\x001"
    elif where == "payload value":
        records = [{"type": "raw", "text": "a\x00b"}]
    else:
        records = [{"type": "raw", "\x00": 1}]
    before = await events(gateway)
    reply = await worker.write(lease, "results", sequence_number=1, idempotency_key=key,
                               payload_sha256=payload_sha256(records), payload=records, final=True)
    assert_problem(reply, 422)
    assert "NUL" in reply.body["detail"]
    assert await events(gateway) == before
    assert await gateway.count("SELECT count(*) FROM worker_result_batches") == 0


async def test_nul_in_operator_text_is_422(gateway: RunningGateway) -> None:
    before = await events(gateway)
    assert_problem(await gateway.operator("POST", "/v1/organizations", {"name": "acme\x00"}), 422)
    assert await events(gateway) == before
    worker, lease = await leased(gateway)
    before = await events(gateway)
    assert_problem(await worker.write(lease, "fail", error="boom\x00", retryable=True), 422)
    assert await events(gateway) == before


async def test_an_escaped_backslash_u0000_is_plain_text(gateway: RunningGateway) -> None:
    reply = await gateway.operator("POST", "/v1/organizations", {"name": "literally \\u0000"})
    assert reply.status == 201 and reply.body["name"] == "literally \\u0000"


# --- cron: well-formed but never firing (found as a 500 from croniter) -------------------------


@pytest.mark.parametrize("cron", ["0 0 31 2 *", "0 0 30 2 *"])
async def test_a_cron_that_never_fires_is_422(gateway: RunningGateway, cron: str) -> None:
    before = await events(gateway)
    reply = await gateway.operator("POST", "/v1/schedules", {
        "organization_id": str(gateway.org), "name": "never", "cron": cron, "profile": [{"task_type": "probe"}]})
    assert_problem(reply, 422)
    assert "never fires" in reply.body["detail"]
    assert await events(gateway) == before


async def test_a_cron_for_february_29th_is_fine(gateway: RunningGateway) -> None:
    reply = await gateway.operator("POST", "/v1/schedules", {
        "organization_id": str(gateway.org), "name": "leap", "cron": "0 0 29 2 *",
        "profile": [{"task_type": "probe"}]})
    assert reply.status == 201, reply.body


# --- numbers and booleans as JSON means them ---------------------------------------------------


async def test_an_integral_float_is_an_integer(gateway: RunningGateway) -> None:
    """JSON (and JSON Schema) has one number type: 5.0 is the integer 5."""
    r = await gateway.operator("POST", f"/v1/scans/{gateway.scan}/tasks",
                               {"task_type": "probe", "priority": 5.0, "max_attempts": 2.0})
    assert r.status == 201, r.body
    assert (r.body["priority"], r.body["max_attempts"]) == (5, 2)
    worker = await gateway.worker()
    assert (await worker.acquire(wait=0.0)).status == 200


@pytest.mark.parametrize("body", [{"priority": 5.5}, {"priority": "5"}, {"priority": True},
                                  {"max_attempts": 1e300}])
async def test_other_numbers_are_not_integers(gateway: RunningGateway, body: dict[str, Any]) -> None:
    before = await events(gateway)
    assert_problem(await gateway.operator("POST", f"/v1/scans/{gateway.scan}/tasks",
                                          {"task_type": "probe", **body}), 422)
    assert await events(gateway) == before


@pytest.mark.parametrize("body", [{"wait_seconds": "0"}, {"wait_seconds": True}])
async def test_acquire_takes_numbers_only(gateway: RunningGateway, body: dict[str, Any]) -> None:
    worker = await gateway.worker()
    assert_problem(await worker.post("/v1/tasks/acquire", body), 422)


@pytest.mark.parametrize(("field", "value"), [("final", "yes"), ("final", 1)])
async def test_booleans_are_booleans(gateway: RunningGateway, field: str, value: Any) -> None:
    worker, lease = await leased(gateway)
    records = [{"type": "raw"}]
    before = await events(gateway)
    reply = await worker.write(lease, "results", sequence_number=1, idempotency_key="k",
                               payload_sha256=payload_sha256(records), payload=records, **{field: value})
    assert_problem(reply, 422)
    assert await events(gateway) == before


# --- query strings: typed as the document says -------------------------------------------------


@pytest.mark.parametrize("query", ["limit=abc", "limit=0", "after=", "after=not-a-uuid", "unknown=1"])
async def test_bad_query_strings_are_422(gateway: RunningGateway, query: str) -> None:
    assert_problem(await gateway.operator("GET", f"/v1/workers?{query}"), 422)


@pytest.mark.parametrize(("after_version", "status"), [(2**63 - 1, 200), (2**63, 422), (10**30, 422)])
async def test_an_event_cursor_beyond_a_bigint_is_422(gateway: RunningGateway, after_version: int,
                                                      status: int) -> None:
    """Stream versions are bigints: a larger cursor used to reach the database (a 500)."""
    task = await gateway.task()
    reply = await gateway.operator("GET", f"/v1/tasks/{task}/events?after_version={after_version}")
    if status == 200:
        assert reply.status == 200 and reply.body["items"] == []
    else:
        assert_problem(reply, status)


async def test_the_document_types_query_parameters(gateway: RunningGateway) -> None:
    doc = (await gateway.operator("GET", "/openapi.json")).body
    params = {p["name"]: p for p in doc["paths"]["/v1/workers"]["get"]["parameters"]}
    assert params["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 500, "default": 100}
    assert params["after"]["schema"] == {"type": "string", "format": "uuid"}
    assert "422" in doc["paths"]["/v1/workers"]["get"]["responses"]


# --- a refused command leaves its pooled connection usable -------------------------------------


async def test_a_refused_command_does_not_poison_its_pooled_connection(database_url: str) -> None:
    """A command refused by a constraint at COMMIT time, in the pipeline where psycopg first
    prepares COMMIT (its 6th use on the connection), left psycopg believing a statement was
    prepared that PostgreSQL never saw, as long as the rollback was a ROLLBACK statement: every
    later command on that connection then failed with ``prepared statement "_pg3_N" does not
    exist`` (a 500 for every request, a crashing sweeper). ``conn.rollback()`` forgets them."""
    pool = create_pool(database_url, min_size=1, max_size=1)  # one connection: every command on it
    await pool.open()
    try:
        registry = Registry(Database(pool))
        taken = f"taken-{uuid.uuid4().hex[:8]}"
        await registry.create_organization(taken)
        outcomes = []
        for i in range(12):
            try:
                await registry.create_organization(taken if i % 2 == 0 else f"free-{uuid.uuid4().hex[:8]}")
                outcomes.append("created")
            except Conflict:
                outcomes.append("conflict")
            except psycopg.Error as exc:
                outcomes.append(type(exc).__name__)
        assert outcomes == ["conflict", "created"] * 6
    finally:
        await pool.close()
