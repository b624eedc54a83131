"""Invariant 1 ("log first"): after random command sequences on real PostgreSQL, rebuilding every
projection from ``events`` with the same projector gives rows identical to the live ones."""

from __future__ import annotations

import random
from typing import Any
from uuid import uuid4

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, given, settings

from leasehold.domain.errors import LeaseholdError
from leasehold.domain.events import ProfileStep
from leasehold.domain.results import payload_sha256
from leasehold.domain.task import project_task
from leasehold.gateway.commands.lifecycle import Acquired
from leasehold.gateway.services import build_services
from leasehold.persistence.chain import verify_chains
from leasehold.persistence.connection import connect
from leasehold.persistence.event_log import read_stream
from leasehold.persistence.queries import QUERIES
from leasehold.persistence.rows import row_factory
from leasehold.persistence.snapshot import snapshot
from leasehold.persistence.tables import load_tables
from leasehold.persistence.task_rows import task_from_row
from leasehold.persistence.transaction import Database
from leasehold.projections.compare import diff
from leasehold.replay.fold import fold
from support.core import ManualClock, World

STEPS = st.lists(
    st.tuples(
        st.sampled_from(["task", "task", "acquire", "acquire", "acquire", "progress", "renew", "batch",
                         "final", "final", "complete", "complete", "fail", "fail_terminal", "cancel", "ack",
                         "stale", "time", "expire", "deadline", "terminate", "poll", "disable", "retry",
                         "org_flag", "profile", "profile_change", "scan_by_profile", "legacy_status"]),
        st.integers(0, 1_000_000),
    ),
    min_size=10, max_size=60,
)


async def run_program(world: World, workers: list[Any], steps: list[tuple[str, int]]) -> None:
    lc = world.lifecycle
    tasks: list[Any] = []
    leases: list[tuple[Any, Acquired]] = []
    batches: dict[Any, int] = {}
    for op, n in steps:
        rng = random.Random(n)
        lease = rng.choice(leases) if leases else None
        try:
            if op == "task" or not tasks:
                # A scan of its own: a scan whose jobs all ended is finished and takes no more.
                scan = await world.scans.create_scan(world.org, {"targets": [f"10.0.0.{n % 250}"]})
                tasks.append(await world.task(scan=scan, max_attempts=rng.randint(1, 3), lease_seconds=rng.choice([5, 30]),
                                              execution_timeout_seconds=rng.choice([20, 300]),
                                              priority=rng.randint(0, 3)))
            elif op == "acquire":
                worker = rng.choice(workers)
                got = await lc.acquire(worker)
                if got is not None:
                    leases.append((worker, got))
            elif op == "time":
                world.clock.advance(rng.choice([1, 4, 11, 40, 400]))
            elif op == "expire":
                await lc.expire_leases()
            elif op == "deadline":
                await lc.exceed_deadlines()
            elif op == "terminate":
                await lc.terminate_cancelling()
            elif op == "cancel":
                await lc.request_cancel(rng.choice(tasks))
            elif op == "poll":  # as the acquire endpoint: hand over (and record) the cancels
                worker = rng.choice(workers)
                polled = await lc.poll(worker)
                await lc.cancels_delivered(worker, [(t, a) for t, a in polled.cancel_requested
                                                    if a in polled.undelivered], channel="long-poll", actor="w")
            elif op == "disable":  # as the operator endpoint: disable, end its attempts, enable again
                worker = rng.choice(workers)
                await world.registry.set_worker_enabled(worker, False)
                await lc.cancel_worker_attempts(worker, reason="worker disabled", actor="op", at_once=True)
                await world.registry.set_worker_enabled(worker, True)
            elif op == "retry":  # refused (409) unless the task is failed_terminal
                await lc.retry(rng.choice(tasks), attempts=rng.choice([None, 1, 2]))
            elif op in ("org_flag", "profile", "profile_change", "scan_by_profile", "legacy_status"):
                await _mode_step(world, op, n, rng)
            elif lease is not None:
                worker, a = lease
                args = (worker, a.task.id, a.attempt.id, a.lease_token)
                if op == "progress":
                    await lc.mark_running(*args)
                elif op == "renew":
                    await lc.renew(*args)
                elif op in ("batch", "final"):
                    seq = batches.get(a.attempt.id, 0) + 1
                    records = [{"type": "raw", "n": n}]
                    await world.final_batch(worker, a, records, key=f"{a.attempt.id}-{seq}", sequence=seq) \
                        if op == "final" else await lc.submit_batch(
                            *args, sequence_number=seq, idempotency_key=f"{a.attempt.id}-{seq}",
                            payload_sha256=payload_sha256(records), records=records, final=False)
                    batches[a.attempt.id] = seq
                elif op == "complete":
                    await lc.complete(*args)
                elif op == "fail":
                    await lc.fail(*args, error=f"error {n}")
                elif op == "fail_terminal":
                    await lc.fail(*args, error="fatal", retryable=False)
                elif op == "ack":
                    await lc.acknowledge_cancel(*args)
                elif op == "stale":
                    await lc.complete(worker, a.task.id, a.attempt.id, "wrong-token")
        except LeaseholdError:
            pass  # refusals are part of the program; they must leave the log consistent too


async def _mode_step(world: World, op: str, n: int, rng: random.Random) -> None:
    """Execution modes and stored profiles, mixed into the task programs."""
    profiles = world.services.profiles
    if op == "org_flag":
        await world.registry.set_gateway_execution(world.org, rng.random() < 0.7)
    elif op == "profile":
        steps = tuple(ProfileStep(task_type="probe", lease_seconds=rng.choice([5, 30])) for _ in range(rng.randint(1, 2)))
        await profiles.create(world.org if rng.random() < 0.7 else None, name=f"p{n % 3}", steps=steps,
                              gateway_execution=rng.random() < 0.7)
    elif op == "profile_change":
        live = await profiles.list()
        if live:
            profile = rng.choice(live)["id"]
            change = rng.choice(["replace", "flag", "delete"])
            if change == "replace":
                await profiles.replace(profile, (ProfileStep(task_type="probe", max_attempts=rng.randint(1, 3)),))
            elif change == "flag":
                await profiles.set_gateway_execution(profile, rng.random() < 0.5)
            else:
                await profiles.delete(profile)
    elif op == "scan_by_profile":
        await world.scans.create_scan(world.org, {"targets": [f"10.2.0.{n % 250}"]}, profile_name=f"p{n % 3}")
    else:
        async with world.pool.connection() as conn:
            cur = await conn.execute("SELECT id FROM scans WHERE execution_mode = 'legacy' ORDER BY id")
            legacy = [r[0] for r in await cur.fetchall()]
        if legacy:
            await world.services.legacy.record_status(
                rng.choice(legacy), rng.choice(["running", "running", "success", "failed", "cancelled"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
async def test_rebuild_from_the_log_equals_live_projections(pool: Any, database_url: str,
                                                            steps: list[tuple[str, int]]) -> None:
    clock = ManualClock()
    services = build_services(Database(pool), clock=clock, rng=random.Random(1))
    world = World(services, clock, org := await services.registry.create_organization(f"org-{uuid4()}"),
                  await services.scans.create_scan(org, {"targets": ["10.0.0.1"]}))
    workers = [await world.worker(capacity=2) for _ in range(3)]
    await run_program(world, workers, steps)
    async with await connect(database_url) as conn:
        async with snapshot(conn):
            rebuilt = await fold(conn)
            live = await load_tables(conn)
        assert diff(live, rebuilt.tables.tables) == []
        assert await verify_chains(conn) == []
        states: set[str] = set()
        # The projected rows also agree with the domain's own fold of each task's stream.
        for (task_id,) in live["worker_tasks"]:
            cur = conn.cursor(row_factory=row_factory("task_get"))
            await cur.execute(QUERIES["task_get"], {"task_id": task_id})
            row_state, _ = task_from_row(await cur.fetchone())
            assert project_task(await read_stream(conn, task_id)) == row_state
            states.add(row_state.state)
        cur = await conn.execute("SELECT DISTINCT split_part(topic, ':', 2) FROM events WHERE topic LIKE ANY("
                                 "ARRAY['%%CancelDelivered', '%%AttemptRevoked'])")
        recorded = sorted(r[0] for r in await cur.fetchall())
    # Not a correctness check: it keeps the generator honest about reaching deep states.
    event("reached: " + ",".join(sorted(states)))
    event("cancellation events: " + (",".join(recorded) or "none"))
    event("scan modes: " + ",".join(sorted({row["execution_mode"] for row in live["scans"].values()}))
          + f"; stored profiles: {bool(live['stored_profiles'])}")


async def test_rebuild_reports_an_edited_projection_row(world: World, pool: Any, database_url: str) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    async with pool.connection() as conn:
        await conn.execute("UPDATE worker_tasks SET priority = 42 WHERE id = %s", (a.task.id,))
    async with await connect(database_url) as conn, snapshot(conn):
        differences = diff(await load_tables(conn), (await fold(conn)).tables.tables)
    assert [(d.table, d.key, set(d.columns)) for d in differences] == [("worker_tasks", (a.task.id,), {"priority"})]
    assert "priority: live=42 rebuilt=0" in str(differences[0])
