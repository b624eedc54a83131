"""Scan profiles run step by step (tasks created lazily, scope enriched with what the
previous steps found), stop_on_failure, and cancelling a whole scan."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from leasehold.domain.events import ProfileStep
from leasehold.domain.results import payload_sha256
from leasehold.gateway.commands.lifecycle import Acquired
from leasehold.persistence.connection import connect
from support.core import World, assert_log_rebuilds_live


async def _rows(world: World, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with world.pool.connection() as conn:
        cur = await conn.execute(query, params)
        return list(await cur.fetchall())


async def _scan_status(world: World, scan: UUID) -> str:
    return (await _rows(world, "SELECT status FROM scans WHERE id = %s", scan))[0][0]


async def _tasks(world: World, scan: UUID) -> list[tuple[Any, ...]]:
    return await _rows(world, "SELECT t.id, t.task_type, t.state, t.scope FROM worker_tasks t"
                              " JOIN scan_jobs j ON j.id = t.scan_job_id WHERE t.scan_id = %s"
                              " ORDER BY j.position", scan)


async def _run(world: World, worker: UUID, records: list[Any], *, key: str = "k-1") -> Acquired:
    a = await world.lifecycle.acquire(worker)
    assert a is not None
    await world.lifecycle.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
    await world.lifecycle.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=1,
                                       idempotency_key=key, payload_sha256=payload_sha256(records),
                                       records=records, final=True)
    await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)
    return a


PROFILE = (ProfileStep(task_type="discover"), ProfileStep(task_type="portscan"),
           ProfileStep(task_type="vulnscan"))


async def test_three_step_profile_runs_in_order_with_enriched_scope(world: World) -> None:
    worker = await world.worker(task_types=("discover", "portscan", "vulnscan"))
    scan = await world.scans.create_scan(world.org, {"targets": ["10.0.0.0/30"]}, profile=PROFILE)
    tasks = await _tasks(world, scan)
    assert [(t[1], t[2]) for t in tasks] == [("discover", "pending")]  # lazily: only step 1
    assert tasks[0][3] == {"targets": ["10.0.0.0/30"]}

    first = await _run(world, worker, [{"type": "asset", "kind": "host", "value": "10.0.0.1"},
                                       {"type": "asset", "kind": "host", "value": "10.0.0.2"},
                                       {"type": "asset", "kind": "host", "value": "10.0.0.1"}])
    assert first.task.task_type == "discover"
    tasks = await _tasks(world, scan)
    assert [(t[1], t[2]) for t in tasks] == [("discover", "completed"), ("portscan", "pending")]
    assert tasks[1][3] == {"targets": ["10.0.0.0/30"], "assets": [
        {"kind": "host", "value": "10.0.0.1"}, {"kind": "host", "value": "10.0.0.2"}]}
    assert await _scan_status(world, scan) == "running"

    second = await _run(world, worker, [{"type": "asset", "kind": "port", "value": "10.0.0.1:22"}])
    assert second.task.task_type == "portscan"
    tasks = await _tasks(world, scan)
    assert tasks[2][1:3] == ("vulnscan", "pending")
    assert {(a["kind"], a["value"]) for a in tasks[2][3]["assets"]} == {
        ("host", "10.0.0.1"), ("host", "10.0.0.2"), ("port", "10.0.0.1:22")}

    third = await _run(world, worker, [{"type": "threat", "external_id": "CVE-1", "title": "x"}])
    assert third.task.task_type == "vulnscan"
    assert [t[2] for t in await _tasks(world, scan)] == ["completed"] * 3
    assert await _scan_status(world, scan) == "success"


async def test_stop_on_failure_step_fails_the_scan_and_creates_no_later_task(world: World) -> None:
    worker = await world.worker(task_types=("discover", "portscan", "vulnscan"))
    scan = await world.scans.create_scan(world.org, {"targets": ["h"]}, profile=(
        ProfileStep(task_type="discover", max_attempts=1), *PROFILE[1:]))
    a = await world.lifecycle.acquire(worker)
    assert a is not None
    await world.lifecycle.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
    await world.lifecycle.fail(worker, a.task.id, a.attempt.id, a.lease_token, error="boom", retryable=False)
    assert [(t[1], t[2]) for t in await _tasks(world, scan)] == [("discover", "failed_terminal")]
    assert await _scan_status(world, scan) == "failed"
    assert await world.lifecycle.acquire(worker) is None


async def test_failure_of_a_continuing_step_moves_on(world: World) -> None:
    worker = await world.worker(task_types=("discover", "portscan"))
    scan = await world.scans.create_scan(world.org, {"targets": ["h"]}, profile=(
        ProfileStep(task_type="discover", max_attempts=1, stop_on_failure=False),
        ProfileStep(task_type="portscan")))
    a = await world.lifecycle.acquire(worker)
    assert a is not None
    await world.lifecycle.fail(worker, a.task.id, a.attempt.id, a.lease_token, error="boom", retryable=False)
    assert [(t[1], t[2]) for t in await _tasks(world, scan)] == [
        ("discover", "failed_terminal"), ("portscan", "pending")]
    await _run(world, worker, [])
    assert await _scan_status(world, scan) == "failed"  # per scan_outcome: a failed job fails it


async def test_cancel_scan_with_one_running_and_two_pending_tasks(world: World) -> None:
    worker = await world.worker(task_types=("probe",))
    scan = await world.scans.create_scan(world.org, {"targets": ["h"]})
    for _ in range(3):
        await world.task(scan=scan)
    running = await world.lifecycle.acquire(worker)
    assert running is not None
    await world.lifecycle.mark_running(worker, running.task.id, running.attempt.id, running.lease_token)

    states = await world.scans.cancel_scan(scan, reason="operator said so")
    assert sorted(t.state for t in states) == ["cancelled", "cancelled", "cancelling"]
    assert await _scan_status(world, scan) == "running"
    assert (await _rows(world, "SELECT cancel_requested_at IS NOT NULL FROM scans WHERE id = %s", scan))[0][0]

    renewed = await world.lifecycle.renew(worker, running.task.id, running.attempt.id, running.lease_token)
    assert renewed.cancel_requested
    await world.lifecycle.acknowledge_cancel(worker, running.task.id, running.attempt.id, running.lease_token)
    assert sorted(t[2] for t in await _tasks(world, scan)) == ["cancelled"] * 3
    assert await _scan_status(world, scan) == "cancelled"
    assert await world.scans.cancel_scan(scan) == []  # repeating it is a no-op


async def test_cancelled_profile_scan_creates_no_further_step(world: World) -> None:
    worker = await world.worker(task_types=("discover", "portscan", "vulnscan"))
    scan = await world.scans.create_scan(world.org, {"targets": ["h"]}, profile=PROFILE)
    a = await world.lifecycle.acquire(worker)
    assert a is not None
    await world.lifecycle.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
    await world.scans.cancel_scan(scan)
    await world.lifecycle.acknowledge_cancel(worker, a.task.id, a.attempt.id, a.lease_token)
    assert [(t[1], t[2]) for t in await _tasks(world, scan)] == [("discover", "cancelled")]
    assert await _scan_status(world, scan) == "cancelled"


async def test_cancel_scan_without_jobs_ends_it_at_once(world: World) -> None:
    scan = await world.scans.create_scan(world.org, {"targets": ["h"]})
    assert await world.scans.cancel_scan(scan) == []
    assert await _scan_status(world, scan) == "cancelled"


async def test_profile_and_cancel_events_rebuild_to_the_live_rows(world: World, database_url: str) -> None:
    worker = await world.worker(task_types=("discover", "portscan", "vulnscan"))
    done = await world.scans.create_scan(world.org, {"targets": ["h"]}, profile=PROFILE[:2])
    await _run(world, worker, [{"type": "asset", "kind": "host", "value": "h"}])
    cancelled = await world.scans.create_scan(world.org, {"targets": ["i"]}, profile=PROFILE)
    await world.scans.cancel_scan(cancelled)
    await assert_log_rebuilds_live(database_url)
    async with await connect(database_url) as conn:
        cur = await conn.execute("SELECT profile IS NOT NULL FROM scans WHERE id = ANY(%s)", ([done, cancelled],))
        assert [r[0] for r in await cur.fetchall()] == [True, True]
