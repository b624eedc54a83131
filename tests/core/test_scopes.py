"""A profile step's scope of any size: every asset the earlier steps found reaches the next step,
however many there are, and the limits meant for what clients send never refuse what the Gateway
derives itself."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import orjson

from leasehold.domain.events import ProfileStep
from leasehold.domain.results import payload_sha256
from leasehold.domain.scopes import whole_scope
from leasehold.gateway.commands.lifecycle import Acquired
from leasehold.gateway.commands.scope_pages import page_count
from support.core import World

PROFILE = (ProfileStep(task_type="discover"), ProfileStep(task_type="probe"))


def services(count: int, *, first_port: int = 1) -> list[dict[str, Any]]:
    """``count`` service assets as the tcp-connect plugin reports them."""
    return [{"type": "asset", "kind": "service", "value": f"127.0.0.1:{port}/tcp"}
            for port in range(first_port, first_port + count)]


async def run_step(world: World, worker: UUID, records: list[Any], *, batch: int = 5_000) -> Acquired:
    """Lease the next task, send ``records`` in batches of ``batch`` (the last one final), complete."""
    a = await world.lifecycle.acquire(worker)
    assert a is not None
    lc = world.lifecycle
    await lc.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
    chunks = [records[i:i + batch] for i in range(0, len(records), batch)] or [[]]
    for n, chunk in enumerate(chunks, 1):
        await lc.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=n,
                              idempotency_key=f"k-{n}", payload_sha256=payload_sha256(chunk), records=chunk,
                              final=n == len(chunks))
    await lc.complete(worker, a.task.id, a.attempt.id, a.lease_token)
    return a


async def whole_scope_of(world: World, worker: UUID, a: Acquired) -> dict[str, Any]:
    """The leased task's whole scope: the lease's inline part and every further page, read as its
    worker reads them."""
    pages = []
    for n in range(1, page_count(a.task)):
        page = await world.services.scope_pages.read(worker, a.task.id, a.attempt.id, a.lease_token, n)
        assert (page.page, page.pages) == (n, page_count(a.task))
        pages.append(orjson.loads(page.body))
    return whole_scope(a.task.scope, pages)


async def task_states(world: World, scan: UUID) -> list[tuple[str, str]]:
    async with world.pool.connection() as conn:
        cur = await conn.execute("SELECT t.task_type, t.state FROM worker_tasks t JOIN scan_jobs j"
                                 " ON j.id = t.scan_job_id WHERE t.scan_id = %s ORDER BY j.position", (scan,))
        return [(r[0], r[1]) for r in await cur.fetchall()]


async def test_a_step_that_finds_1600_services_hands_every_one_to_the_next_step(world: World) -> None:
    """1,600 service assets make a scope larger than the 64 KiB a client may send: the step still
    completes (it was refused with 413 and retried until the scan failed) and the next step's
    task is created with all of them."""
    worker = await world.worker(task_types=("discover", "probe"))
    scan = await world.scans.create_scan(world.org, {"targets": ["127.0.0.1"]}, profile=PROFILE)
    found = services(1_600)
    await run_step(world, worker, found)
    assert await task_states(world, scan) == [("discover", "completed"), ("probe", "pending")]
    nxt = await world.lifecycle.acquire(worker)
    assert nxt is not None and nxt.task.task_type == "probe"
    async with world.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM asset_sightings s JOIN scan_jobs j ON j.id = s.scan_job_id"
            " WHERE s.scan_id = %s", (scan,))
        assert (await cur.fetchone()) == (1_600,)
    scope = await whole_scope_of(world, worker, nxt)
    assert scope["targets"] == ["127.0.0.1"]
    values = [a["value"] for a in scope["assets"]]
    assert sorted(values) == sorted(r["value"] for r in found) and len(set(values)) == 1_600
