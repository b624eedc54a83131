"""A profile step's scope of any size: every asset the earlier steps found reaches the next step,
however many there are, and the limits meant for what clients send never refuse what the Gateway
derives itself."""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

import orjson
import pytest

from leasehold.domain.errors import Forbidden, LeaseLost
from leasehold.domain.events import ProfileStep
from leasehold.domain.results import payload_sha256
from leasehold.domain.scopes import whole_scope
from leasehold.gateway.commands.lifecycle import Acquired, ResultBatch
from leasehold.gateway.commands.scope_pages import page_count
from support.core import World, assert_log_rebuilds_live

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


async def test_the_final_batch_sent_with_complete_is_in_the_next_steps_scope(world: World) -> None:
    """The agent sends its last batch with complete: its assets are ingested before the step's end
    makes the next scope (from the ingestion tables), in the same transaction."""
    worker = await world.worker(task_types=("discover", "probe"))
    await world.scans.create_scan(world.org, {"targets": ["h"]}, profile=PROFILE)
    first = await world.lifecycle.acquire(worker)
    assert first is not None
    await lease_and_finish(world, worker, first, services(3))
    nxt = await world.lifecycle.acquire(worker)
    assert nxt is not None
    assert [a["value"] for a in nxt.task.scope["assets"]] == [r["value"] for r in services(3)]


async def stored_pages(world: World, task_id: UUID) -> list[str]:
    async with world.pool.connection() as conn:
        cur = await conn.execute("SELECT scope_pages FROM worker_tasks WHERE id = %s", (task_id,))
        row = await cur.fetchone()
    assert row is not None
    return list(row[0])


@pytest.mark.slow
async def test_a_first_step_that_finds_100000_assets_runs_every_step_to_the_end(
        world: World, database_url: str) -> None:
    """The shape of a large scan: the first step reports 100,000 services in 100 batches; the
    second step's task is created and leased with all of them, read back in pages as its worker
    reads them; the third step's scope adds what the second found and shares the second's full
    pages; the scan succeeds, and the log rebuilds to the live rows."""
    worker = await world.worker(task_types=("discover", "probe", "inspect"))
    steps = (ProfileStep(task_type="discover"), ProfileStep(task_type="probe"), ProfileStep(task_type="inspect"))
    scan = await world.scans.create_scan(world.org, {"targets": ["10.0.0.0/8"]}, profile=steps)
    found = services(100_000)
    timings: dict[str, float] = {}

    started = time.perf_counter()
    await run_step(world, worker, found, batch=1_000)
    timings["discover_100_batches_and_complete_s"] = time.perf_counter() - started
    started = time.perf_counter()
    probe = await world.lifecycle.acquire(worker)
    assert probe is not None and probe.task.task_type == "probe" and probe.task.scope_ref is not None
    assert probe.task.scope_ref.assets == 100_000 and probe.task.scope_ref.omitted == 0
    assert len(orjson.dumps(probe.task.scope)) <= 70_000  # the lease carries the first page only
    scope = await whole_scope_of(world, worker, probe)
    timings["lease_and_read_every_page_s"] = time.perf_counter() - started
    assert scope["targets"] == ["10.0.0.0/8"]
    assert {a["value"] for a in scope["assets"]} == {r["value"] for r in found}
    assert len(scope["assets"]) == 100_000

    urls = [{"type": "asset", "kind": "url", "value": f"http://10.0.0.{n}/"} for n in range(10)]
    started = time.perf_counter()
    await lease_and_finish(world, worker, probe, urls)
    timings["probe_complete_building_next_scope_s"] = time.perf_counter() - started
    inspect = await world.lifecycle.acquire(worker)
    assert inspect is not None and inspect.task.task_type == "inspect"
    assert inspect.task.scope_ref is not None and inspect.task.scope_ref.assets == 100_010
    later = await whole_scope_of(world, worker, inspect)
    assert later["assets"][:100_000] == scope["assets"]  # the earlier scope, then what came since
    assert {a["value"] for a in later["assets"][100_000:]} == {u["value"] for u in urls}
    earlier_pages = await stored_pages(world, probe.task.id)
    assert (await stored_pages(world, inspect.task.id))[: len(earlier_pages) - 1] == earlier_pages[:-1]

    await lease_and_finish(world, worker, inspect, [])
    async with world.pool.connection() as conn:
        cur = await conn.execute("SELECT status FROM scans WHERE id = %s", (scan,))
        assert await cur.fetchone() == ("success",)
    await assert_log_rebuilds_live(database_url)
    print(" ".join(f"{name}={seconds:.2f}" for name, seconds in timings.items()))


async def lease_and_finish(world: World, worker: UUID, a: Acquired, records: list[Any]) -> None:
    """Finish an attempt already leased: ``records`` as its one final batch, then complete."""
    lc = world.lifecycle
    await lc.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
    await lc.complete(worker, a.task.id, a.attempt.id, a.lease_token, final_batch=ResultBatch(
        1, "k-1", payload_sha256(records), records))


async def test_a_scope_read_after_the_lease_ran_out_or_the_assignment_was_revoked_is_refused(world: World) -> None:
    """The other refusals a write would get, with the injected clock: a lease that ran out, and a
    worker whose assignment to the task's organisation was revoked."""
    worker = await world.worker(task_types=("probe",))
    big = {"targets": ["h"], "assets": [{"kind": "service", "value": f"h:{n}/tcp"} for n in range(3_000)]}
    a = await world.leased(worker, scope=big, lease_seconds=30)
    read = world.services.scope_pages.read
    assert (await read(worker, a.task.id, a.attempt.id, a.lease_token, 1)).page == 1
    world.clock.advance(31)
    with pytest.raises(LeaseLost, match="expired"):
        await read(worker, a.task.id, a.attempt.id, a.lease_token, 1)

    b = await world.leased(worker, scope=big, lease_seconds=30)
    await world.registry.end_assignment(worker, world.org, revoke=True)
    with pytest.raises(Forbidden, match="revoked"):
        await read(worker, b.task.id, b.attempt.id, b.lease_token, 1)
