"""Workers and assignments: the commands against a real PostgreSQL (lock, separate read, append,
project; rebuild equals live; revocation's task cancellation). The pure decisions are unit-tested
in tests/unit/test_registry_rules.py."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any
from uuid import UUID, uuid4

import pytest

from leasehold.domain import registry as rules
from leasehold.domain.errors import Forbidden, InvalidTransition, NotFound, TaskWasCancelled
from leasehold.persistence.connection import connect
from leasehold.persistence.event_log import read_stream
from support.core import World, assert_log_rebuilds_live

# --- commands against PostgreSQL ---------------------------------------------------------------


async def scalar(pool: Any, query: str, *params: Any) -> Any:
    async with pool.connection() as conn:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
        return row[0] if row else None


async def test_worker_commands_project_their_rows_and_the_log_rebuilds_them(world: World, pool: Any,
                                                                           database_url: str) -> None:
    reg = world.registry
    other = await reg.create_organization("other")
    worker = await world.worker(capacity=2)  # registered and assigned to world.org
    state = await reg.update_worker(worker, capabilities=("ipv6", "ipv4"), max_concurrent_tasks=5, actor="op")
    assert state.capabilities == ("ipv4", "ipv6") and state.max_concurrent_tasks == 5 and state.version == 3
    assert (await reg.set_worker_enabled(worker, False, actor="op")).enabled is False
    assert (await reg.set_worker_enabled(worker, True, actor="op")).enabled is True
    assert (await reg.assign_worker(worker, other, actor="op")).assignments[other].active
    removed = await reg.end_assignment(worker, world.org, revoke=False, actor="op")
    assert not removed.assignments[world.org].active and not removed.assignments[world.org].revoked
    revoked = await reg.end_assignment(worker, other, revoke=True, actor="op")
    assert revoked.assignments[other].revoked
    final = await reg.revoke_worker(worker, reason="stolen laptop", actor="op")
    assert final.revoked and not final.enabled

    row = await scalar(pool, "SELECT row(enabled, revoked_at IS NOT NULL, capabilities, max_concurrent_tasks,"
                             " version)::text FROM workers WHERE id = %s", worker)
    assert row == f'(f,t,"{{ipv4,ipv6}}",5,{final.version})'
    assignments = await scalar(pool, "SELECT string_agg(row(enabled, revoked_at IS NOT NULL)::text, ';'"
                                     " ORDER BY organization_id = %s) FROM organization_workers WHERE worker_id = %s",
                               other, worker)
    assert assignments == "(f,f);(f,t)"  # world.org removed; other revoked
    # The worker's own stream folds to the state the commands returned.
    async with await connect(database_url) as conn:
        assert rules.project_worker(await read_stream(conn, worker)) == final
    await assert_log_rebuilds_live(database_url)


async def test_repeated_commands_append_nothing(world: World, pool: Any) -> None:
    reg = world.registry
    worker = await world.worker()
    await reg.end_assignment(worker, world.org, revoke=False, actor="op")
    await reg.revoke_worker(worker, reason="r", actor="op")
    before = await scalar(pool, "SELECT count(*) FROM events")
    await reg.revoke_worker(worker, reason="r", actor="op")
    await reg.set_worker_enabled(worker, False, actor="op")
    await reg.end_assignment(worker, world.org, revoke=False, actor="op")
    assert await scalar(pool, "SELECT count(*) FROM events") == before
    with pytest.raises(InvalidTransition):
        await reg.set_worker_enabled(worker, True, actor="op")
    assert await scalar(pool, "SELECT count(*) FROM events") == before


async def test_unknown_worker_or_organisation_is_not_found_and_changes_nothing(world: World, pool: Any) -> None:
    worker = await world.worker()
    before = await scalar(pool, "SELECT count(*) FROM events")
    with pytest.raises(NotFound):
        await world.registry.assign_worker(worker, uuid4())
    with pytest.raises(NotFound):
        await world.registry.revoke_worker(uuid4(), reason="r")
    with pytest.raises(NotFound):
        await world.registry.end_assignment(worker, uuid4(), revoke=True)
    assert await scalar(pool, "SELECT count(*) FROM events") == before


async def test_concurrent_commands_on_one_worker_serialise_on_its_row(world: World, pool: Any) -> None:
    """Without the row lock (or with the read inside the locking statement) two of these would
    decide on the same version and the second append would hit the stream's primary key."""
    reg = world.registry
    worker = await world.worker()
    orgs = [await reg.create_organization(f"org-{i}") for i in range(5)]
    jobs = [reg.update_worker(worker, max_concurrent_tasks=n, actor="op") for n in range(2, 22)]
    jobs += [reg.assign_worker(worker, org, actor="op") for org in orgs]
    await asyncio.gather(*jobs)
    versions = await scalar(pool, "SELECT array_agg(originator_version ORDER BY originator_version) FROM events"
                                  " WHERE originator_id = %s", worker)
    assert versions == list(range(1, len(versions) + 1)) and len(versions) == 2 + 20 + 5
    assert await scalar(pool, "SELECT count(*) FROM organization_workers WHERE worker_id = %s AND enabled",
                        worker) == 6


async def test_disabled_revoked_or_unassigned_workers_lease_nothing(world: World) -> None:
    reg, lc = world.registry, world.lifecycle
    disabled, revoked, removed, revoked_assignment = [await world.worker() for _ in range(4)]
    await reg.set_worker_enabled(disabled, False)
    await reg.revoke_worker(revoked, reason="r")
    await reg.end_assignment(removed, world.org, revoke=False)
    await reg.end_assignment(revoked_assignment, world.org, revoke=True)
    await world.task()
    for worker in (disabled, revoked, removed, revoked_assignment):
        assert await lc.acquire(worker) is None
    await reg.assign_worker(removed, world.org)  # an explicit re-add restores leasing
    assert await lc.acquire(removed) is not None


async def test_api_key_is_stored_only_as_its_hash(world: World, pool: Any) -> None:
    issued = await world.registry.create_api_key(organization_id=world.org, name="ci")
    assert issued.key.startswith("lh_") and len(issued.key) > 40
    stored = await scalar(pool, "SELECT key_hash FROM api_keys WHERE id = %s", issued.id)
    assert bytes(stored) == hashlib.sha256(issued.key.encode()).digest()
    assert await scalar(pool, "SELECT count(*) FROM api_keys WHERE name = %s", issued.key) == 0
    with pytest.raises(NotFound):
        await world.registry.create_api_key(organization_id=uuid4(), name="x")


# --- revocation: cancelling the worker's tasks ------------------------------------------------


async def test_security_revocation_cancels_live_attempts_once(world: World, pool: Any, database_url: str) -> None:
    reg, lc = world.registry, world.lifecycle
    worker = await world.worker(capacity=3)
    bystander = await world.worker()
    running = await world.running(worker)
    leased = await world.leased(worker)
    theirs = await world.running(bystander)
    await reg.revoke_worker(worker, reason="compromised")
    cancelled = await lc.cancel_worker_attempts(worker, reason="worker revoked", actor="op")
    assert sorted(cancelled) == sorted([running.task.id, leased.task.id])
    assert await lc.cancel_worker_attempts(worker, reason="again", actor="op") == []  # idempotent
    states = await scalar(pool, "SELECT array_agg(state ORDER BY id = %s) FROM worker_tasks", theirs.task.id)
    assert states == ["cancelling", "cancelling", "running"]
    # Fencing now refuses the revoked worker's writes (the HTTP layer refuses them even earlier),
    # and the refusal is recorded.
    with pytest.raises(TaskWasCancelled):
        await world.final_batch(worker, running)
    with pytest.raises(Forbidden):
        await lc.renew(worker, running.task.id, running.attempt.id, running.lease_token)
    assert await scalar(pool, "SELECT count(*) FROM events WHERE topic LIKE '%%WriteRejected'") == 1
    await assert_log_rebuilds_live(database_url)


async def test_revocation_does_not_cancel_a_task_another_worker_has_since_leased(world: World, pool: Any) -> None:
    reg, lc, clock = world.registry, world.lifecycle, world.clock
    worker = await world.worker()
    successor = await world.worker()
    first = await world.running(worker, lease_seconds=5, max_attempts=2)
    clock.advance(6)
    assert await lc.expire_leases() == 1  # -> retry_wait
    clock.advance(600)
    second = await lc.acquire(successor)
    assert second is not None and second.task.id == first.task.id
    await reg.revoke_worker(worker, reason="r")
    assert await lc.cancel_worker_attempts(worker, reason="worker revoked", actor="op") == []
    assert await scalar(pool, "SELECT state FROM worker_tasks") == "leased"


async def test_assignment_revocation_cancels_only_that_organisations_tasks(world: World, pool: Any) -> None:
    reg, lc = world.registry, world.lifecycle
    other = await reg.create_organization("other")
    other_scan = await world.scans.create_scan(other, {"targets": []})
    worker = await world.worker(capacity=2)
    await reg.assign_worker(worker, other)
    mine = await world.running(worker)
    await world.task(scan=other_scan)
    theirs = await lc.acquire(worker)
    assert theirs is not None and theirs.task.organization_id == other
    await reg.end_assignment(worker, world.org, revoke=True)
    # Renewal is refused as soon as the assignment is revoked, before any cancellation ...
    with pytest.raises(Forbidden):
        await lc.renew(worker, mine.task.id, mine.attempt.id, mine.lease_token)
    assert await lc.cancel_worker_attempts(worker, organization_id=world.org, reason="r", actor="op") == [mine.task.id]
    # ... and once the task is cancelling it answers with the cancellation (no extension).
    renewed = await lc.renew(worker, mine.task.id, mine.attempt.id, mine.lease_token)
    assert renewed.cancel_requested
    assert renewed.task.current_attempt is not None
    assert renewed.task.current_attempt.lease_expires_at == mine.attempt.lease_expires_at
    acked = await lc.acknowledge_cancel(worker, mine.task.id, mine.attempt.id, mine.lease_token)
    assert acked.state == "cancelled"
    still = await lc.renew(worker, theirs.task.id, theirs.attempt.id, theirs.lease_token)
    assert not still.cancel_requested and still.task.state == "leased"


async def test_revocation_racing_acquires_leaves_nothing_of_that_organisation_live(world: World, pool: Any) -> None:
    """RFC "Race with assignment removal": an acquire either commits before the revocation (the
    worker row lock orders them), and is then cancelled by it, or it sees the revocation and
    leases nothing. Once the revocation returns, nothing of that organisation runs on the worker."""
    reg, lc = world.registry, world.lifecycle
    worker = await world.worker(capacity=1000)
    total = 150
    for _ in range(total):
        await world.task()

    leasing = asyncio.Event()  # the revocation comes while the acquirers are leasing, not before

    async def acquire_until_refused() -> int:
        leased = 0
        while await lc.acquire(worker) is not None:
            leased += 1
            leasing.set()
        return leased

    async def revoke() -> list[UUID]:
        await leasing.wait()
        await reg.end_assignment(worker, world.org, revoke=True)
        return await lc.cancel_worker_attempts(worker, organization_id=world.org, reason="r", actor="op")

    *counts, cancelled = await asyncio.gather(*(acquire_until_refused() for _ in range(8)), revoke())
    leased = sum(counts)
    assert len(cancelled) == leased
    assert await scalar(pool, """
        SELECT count(*) FROM worker_task_attempts a JOIN worker_tasks t ON t.current_attempt_id = a.id
        WHERE a.worker_id = %s AND a.status IN ('leased', 'running') AND t.state IN ('leased', 'running')""",
                        worker) == 0
    assert await scalar(pool, "SELECT count(*) FROM worker_tasks WHERE state = 'pending'") == total - leased
