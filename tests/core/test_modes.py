"""Execution modes and stored profiles on real PostgreSQL: the flags decide each new scan's mode
(their precedence table is unit-tested in tests/unit/test_profile_rules.py), a legacy job never
gets a worker task (code and database), the rollback switch leaves running scans alone,
stored-profile edits never reach existing scans, and every new event rebuilds to the live rows."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg
import pytest

from leasehold.domain.errors import Conflict, InvalidTransition, NotFound
from leasehold.domain.events import ProfileStep
from leasehold.domain.profiles import LegacyExecuted
from leasehold.domain.results import payload_sha256
from leasehold.gateway.commands.lifecycle import Acquired, TaskSpec
from support.core import World, assert_log_rebuilds_live
from support.locks import waits_while_running

TWO_STEPS = (ProfileStep(task_type="discover", lease_seconds=300), ProfileStep(task_type="portscan", lease_seconds=120))


async def _rows(world: World, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with world.pool.connection() as conn:
        cur = await conn.execute(query, params)
        return list(await cur.fetchall())


async def _shape(world: World, scan: UUID) -> tuple[str, list[tuple[str, str]], int]:
    """(the scan's mode, its jobs' (plugin, mode) in order, how many worker tasks it has)."""
    ((mode,),) = await _rows(world, "SELECT execution_mode FROM scans WHERE id = %s", scan)
    jobs = await _rows(world, "SELECT plugin, execution_mode FROM scan_jobs WHERE scan_id = %s ORDER BY position",
                       scan)
    ((tasks,),) = await _rows(world, "SELECT count(*) FROM worker_tasks WHERE scan_id = %s", scan)
    return mode, [(p, m) for p, m in jobs], tasks


async def _run(world: World, worker: UUID) -> Acquired:
    a = await world.lifecycle.acquire(worker)
    assert a is not None
    lc = world.lifecycle
    await lc.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
    records = [{"type": "asset", "kind": "host", "value": "10.0.0.1"}]
    await lc.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=1, idempotency_key="k",
                          payload_sha256=payload_sha256(records), records=records, final=True)
    await lc.complete(worker, a.task.id, a.attempt.id, a.lease_token)
    return a


async def test_the_flags_decide_each_new_scans_mode(world: World, database_url: str) -> None:
    profiles = world.services.profiles
    await profiles.create(world.org, name="on", steps=TWO_STEPS)
    await profiles.create(world.org, name="off", steps=TWO_STEPS, gateway_execution=False)
    create = world.scans.create_scan
    targets = {"targets": ["10.0.0.1"]}

    assert await _shape(world, await create(world.org, targets)) == ("gateway", [], 0)
    assert await _shape(world, await create(world.org, targets, profile=TWO_STEPS)) == (
        "gateway", [("discover", "gateway")], 1)  # lazily: the first step only
    assert await _shape(world, await create(world.org, targets, profile_name="on")) == (
        "gateway", [("discover", "gateway")], 1)
    assert await _shape(world, await create(world.org, targets, profile_name="off")) == (
        "legacy", [("discover", "legacy"), ("portscan", "legacy")], 0)  # every job recorded, no task
    assert await _shape(world, await create(world.org, targets, execution_mode="legacy")) == ("legacy", [], 0)
    with pytest.raises(LegacyExecuted):
        await create(world.org, targets, profile_name="off", execution_mode="gateway")

    await world.registry.set_gateway_execution(world.org, False, actor="operator:k")
    await world.registry.set_gateway_execution(world.org, False, actor="operator:k")  # a no-op
    assert await _rows(world, "SELECT count(*) FROM events WHERE originator_id = %s AND topic LIKE %s",
                       world.org, "%OrganizationGatewayExecutionSet") == [(1,)]
    for kwargs in ({}, {"profile": TWO_STEPS}, {"profile_name": "on"}, {"profile_name": "off"}):
        mode, jobs, tasks = await _shape(world, await create(world.org, targets, **kwargs))  # type: ignore[arg-type]
        assert (mode, tasks, {m for _, m in jobs} <= {"legacy"}) == ("legacy", 0, True), kwargs
    with pytest.raises(LegacyExecuted):
        await create(world.org, targets, execution_mode="gateway")
    with pytest.raises(NotFound):
        await world.registry.set_gateway_execution(UUID(int=1), True)
    await assert_log_rebuilds_live(database_url)


async def test_a_legacy_job_never_gets_a_worker_task(world: World, database_url: str) -> None:
    worker = await world.worker(task_types=("discover", "portscan", "probe"), capacity=4)
    scan = await world.scans.create_scan(world.org, {"targets": ["10.0.0.1"]}, profile=TWO_STEPS,
                                            execution_mode="legacy")
    assert await world.lifecycle.acquire(worker) is None  # an idle, capable worker: nothing to lease
    with pytest.raises(InvalidTransition):
        await world.lifecycle.create_task(scan, TaskSpec(task_type="probe"))
    ((job,),) = await _rows(world, "SELECT id FROM scan_jobs WHERE scan_id = %s AND position = 0", scan)

    # The database refuses it too, whatever code tries (the test's role is the owner, no bypass).
    gateway_scan = await world.scans.create_scan(world.org, {}, profile=TWO_STEPS)
    ((gateway_job,),) = await _rows(world, "SELECT id FROM scan_jobs WHERE scan_id = %s", gateway_scan)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation, match="creates no worker task"):
            columns = ("organization_id, task_type, required_capabilities, priority, scope, parameters, state,"
                       " available_at, attempt_count, max_attempts, lease_seconds, execution_timeout_seconds,"
                       " created_at, updated_at, version, head_hash")
            await conn.execute(
                f"INSERT INTO worker_tasks (id, scan_job_id, scan_id, {columns})"  # noqa: S608
                f" SELECT gen_random_uuid(), %s, %s, {columns} FROM worker_tasks WHERE scan_job_id = %s",
                (job, scan, gateway_job))
        with pytest.raises(psycopg.errors.CheckViolation, match="creates no worker task"):
            await conn.execute("UPDATE worker_tasks SET scan_job_id = %s WHERE scan_job_id = %s", (job, gateway_job))
        with pytest.raises(psycopg.errors.CheckViolation, match="never changes"):
            await conn.execute("UPDATE scan_jobs SET execution_mode = 'gateway' WHERE id = %s", (job,))
        with pytest.raises(psycopg.errors.CheckViolation, match="never changes"):
            await conn.execute("UPDATE scans SET execution_mode = 'gateway' WHERE id = %s", (scan,))
        with pytest.raises(psycopg.errors.CheckViolation, match="its scan"):
            await conn.execute(
                "INSERT INTO scan_jobs (id, scan_id, organization_id, position, plugin, status, execution_mode,"
                " created_at, updated_at) SELECT gen_random_uuid(), %s, organization_id, 7, plugin, status, 'gateway',"
                " created_at, updated_at FROM scan_jobs WHERE id = %s", (scan, job))
    assert await _shape(world, scan) == ("legacy", [("discover", "legacy"), ("portscan", "legacy")], 0)
    await assert_log_rebuilds_live(database_url)


async def test_flag_off_makes_new_scans_legacy_while_a_running_gateway_scan_finishes(
        world: World, database_url: str) -> None:
    worker = await world.worker(task_types=("discover", "portscan"), capacity=2)
    running = await world.scans.create_scan(world.org, {"targets": ["10.0.0.0/30"]}, profile=TWO_STEPS)
    first = await world.lifecycle.acquire(worker)
    assert first is not None and first.task.scan_id == running

    await world.registry.set_gateway_execution(world.org, False, actor="operator:rollback")
    later = await world.scans.create_scan(world.org, {"targets": ["10.0.0.9"]}, profile=TWO_STEPS)
    assert (await _shape(world, later))[0] == "legacy"

    lc = world.lifecycle
    records = [{"type": "asset", "kind": "host", "value": "10.0.0.1"}]
    await lc.mark_running(worker, first.task.id, first.attempt.id, first.lease_token)
    await lc.submit_batch(worker, first.task.id, first.attempt.id, first.lease_token, sequence_number=1,
                          idempotency_key="k", payload_sha256=payload_sha256(records), records=records, final=True)
    await lc.complete(worker, first.task.id, first.attempt.id, first.lease_token)
    second = await _run(world, worker)  # the running scan's next step still runs on the Gateway
    assert (second.task.scan_id, second.task.task_type, second.task.lease_seconds) == (running, "portscan", 120)
    assert await _rows(world, "SELECT status, execution_mode FROM scans WHERE id = %s", running) == [
        ("success", "gateway")]
    assert await lc.acquire(worker) is None  # and nothing of the legacy scan
    await assert_log_rebuilds_live(database_url)


async def test_a_flag_change_waits_for_scans_being_created_and_they_see_it(world: World, database_url: str) -> None:
    """A flag change in flight (its row lock held) makes a concurrent scan creation wait, and
    the scan then sees the new flag: no Gateway scan commits after the switch went off."""
    async with await psycopg.AsyncConnection.connect(database_url) as flipper:
        # The row lock Registry.set_gateway_execution holds until it commits.
        await flipper.execute("UPDATE organizations SET gateway_execution = false WHERE id = %s", (world.org,))
        creating, waiting = await waits_while_running(
            world.pool, flipper.info.backend_pid, world.scans.create_scan(world.org, {}, profile=TWO_STEPS))
        assert waiting, "the scan creation never waited for the flag change"
        assert not creating.done()
        await flipper.commit()
    scan = await creating
    assert await _shape(world, scan) == ("legacy", [("discover", "legacy"), ("portscan", "legacy")], 0)


async def test_stored_profile_edits_never_change_an_existing_scan(world: World, database_url: str) -> None:
    profiles = world.services.profiles
    worker = await world.worker(task_types=("discover", "portscan", "vulnscan"), capacity=2)
    profile = await profiles.create(world.org, name="weekly", steps=TWO_STEPS, actor="operator:k")
    scan = await world.scans.create_scan(world.org, {"targets": ["10.0.0.1"]}, profile_name="weekly")
    assert await _rows(world, "SELECT stored_profile_id FROM scans WHERE id = %s", scan) == [(profile,)]

    await profiles.replace(profile, (ProfileStep(task_type="vulnscan"),), actor="operator:k")
    await profiles.replace(profile, (ProfileStep(task_type="vulnscan"),), actor="operator:k")  # a no-op
    assert (await profiles.get(profile))["version"] == 2
    first = await _run(world, worker)
    assert (first.task.scan_id, first.task.task_type, first.task.lease_seconds) == (scan, "discover", 300)
    second = await _run(world, worker)  # from the scan's own copy, every field of it
    assert (second.task.scan_id, second.task.task_type, second.task.lease_seconds) == (scan, "portscan", 120)
    newer = await world.scans.create_scan(world.org, {}, profile_name="weekly")
    assert (await _shape(world, newer))[1] == [("vulnscan", "gateway")]

    with pytest.raises(Conflict, match="already exists"):
        await profiles.create(world.org, name="weekly", steps=TWO_STEPS)
    await profiles.delete(profile)
    with pytest.raises(NotFound):
        await world.scans.create_scan(world.org, {}, profile_name="weekly")
    with pytest.raises(NotFound):
        await profiles.delete(profile)
    assert await _rows(world, "SELECT status FROM scans WHERE id = %s", scan) == [("success",)]
    again = await profiles.create(world.org, name="weekly", steps=TWO_STEPS)  # the name is free again
    assert again != profile
    await assert_log_rebuilds_live(database_url)


async def test_profile_names_resolve_per_organisation(world: World, database_url: str) -> None:
    profiles = world.services.profiles
    other = await world.registry.create_organization("other")
    await profiles.create(other, name="theirs", steps=TWO_STEPS)
    with pytest.raises(NotFound):  # another organisation's profile does not exist for this one
        await world.scans.create_scan(world.org, {}, profile_name="theirs")
    shared = await profiles.create(None, name="baseline", steps=(ProfileStep(task_type="discover"),))
    scan = await world.scans.create_scan(world.org, {}, profile_name="baseline")
    assert await _rows(world, "SELECT stored_profile_id FROM scans WHERE id = %s", scan) == [(shared,)]
    own = await profiles.create(world.org, name="baseline", steps=(ProfileStep(task_type="portscan"),))
    scan = await world.scans.create_scan(world.org, {}, profile_name="baseline")  # its own one hides the global
    assert await _rows(world, "SELECT stored_profile_id FROM scans WHERE id = %s", scan) == [(own,)]
    with pytest.raises(NotFound):  # an organisation changes only its own profiles
        await profiles.replace(shared, TWO_STEPS, owner=world.org)
    await profiles.set_gateway_execution(own, False, owner=world.org)
    scan = await world.scans.create_scan(world.org, {}, profile_name="baseline")
    assert (await _shape(world, scan))[0] == "legacy"
    await assert_log_rebuilds_live(database_url)


async def test_legacy_progress_reports(world: World, database_url: str) -> None:
    legacy = world.services.legacy
    scan = await world.scans.create_scan(world.org, {}, profile=TWO_STEPS, execution_mode="legacy")
    assert await _rows(world, "SELECT legacy_scan_id FROM scans WHERE id = %s", scan) == [(str(scan),)]
    await legacy.record_status(scan, "running", actor="operator:k")
    await legacy.record_status(scan, "running", actor="operator:k")  # a no-op
    with pytest.raises(InvalidTransition):
        await legacy.record_status(scan, "pending")
    await legacy.record_status(scan, "success")
    with pytest.raises(InvalidTransition):
        await legacy.record_status(scan, "failed")
    with pytest.raises(InvalidTransition):  # the Gateway's own scans are not reported on
        await legacy.record_status(world.scan, "running")
    with pytest.raises(NotFound):
        await legacy.record_status(scan, "running", organization_id=await world.registry.create_organization("x"))
    assert await _rows(world, "SELECT status, finished_at IS NOT NULL FROM scans WHERE id = %s", scan) == [
        ("success", True)]
    assert await _rows(world, "SELECT count(*) FROM events WHERE originator_id = %s AND topic LIKE %s", scan,
                       "%LegacyScanStatusRecorded") == [(2,)]
    await assert_log_rebuilds_live(database_url)
