"""The RFC's task transition table, row by row, through the service layer on real PostgreSQL.

Each test names the row it covers: actor, precondition, mutation and idempotency rule.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest

from leasehold.domain.errors import (
    DeadlineExceeded,
    IdempotencyConflict,
    InvalidRequest,
    InvalidTransition,
    LeaseLost,
    NotFound,
    TaskWasCancelled,
)
from leasehold.domain.results import payload_sha256
from support.core import World, event_count


async def scalar(pool: Any, query: str, *params: object) -> Any:
    async with pool.connection() as conn:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
        return row[0]


async def topics(pool: Any, stream: UUID) -> list[str]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT topic FROM events WHERE originator_id = %s ORDER BY originator_version", (stream,))
        return [r[0].split(":")[1] for r in await cur.fetchall()]


# pending -> leased ------------------------------------------------------------------------


async def test_acquire_leases_pending_task_and_records_attempt(world: World, pool: Any) -> None:
    worker = await world.worker()
    task_id = await world.task()
    acquired = await world.lifecycle.acquire(worker)
    assert acquired is not None and acquired.task.id == task_id
    assert acquired.task.state == "leased" and acquired.task.attempt_count == 1
    row = await scalar(pool, "SELECT row(status, attempt_number, lease_token_hash = sha256(%s::bytea))::text"
                       " FROM worker_task_attempts WHERE task_id = %s", acquired.lease_token.encode(), task_id)
    assert row == "(leased,1,t)"
    assert await scalar(pool, "SELECT status FROM scan_jobs") == "running"
    assert await scalar(pool, "SELECT status FROM scans") == "running"


@pytest.mark.parametrize("case", ["eligible", "unassigned", "wrong_type", "missing_capability",
                                  "disabled_assignment"])
async def test_acquire_requires_assignment_and_capability(world: World, pool: Any, case: str) -> None:
    """Each refused case differs from the eligible worker in exactly one respect, so each is
    refused for the reason it names (the eligible case shows nothing else is missing)."""
    able = ("ipv4", "ipv6")
    if case == "unassigned":
        worker = await world.worker(capabilities=able, org=await world.registry.create_organization("other"))
    elif case == "wrong_type":
        worker = await world.worker(capabilities=able, task_types=("something-else",))
    elif case == "missing_capability":
        worker = await world.worker(capabilities=("ipv4",))
    else:
        worker = await world.worker(capabilities=able)
    if case == "disabled_assignment":
        async with pool.connection() as conn:
            await conn.execute("UPDATE organization_workers SET enabled = false WHERE worker_id = %s", (worker,))
    task_id = await world.task(required_capabilities=able)
    acquired = await world.lifecycle.acquire(worker)
    if case == "eligible":
        assert acquired is not None and acquired.task.id == task_id
        assert await scalar(pool, "SELECT state FROM worker_tasks") == "leased"
    else:
        assert acquired is None
        assert await scalar(pool, "SELECT state FROM worker_tasks") == "pending"


@pytest.mark.parametrize("mismatch", ["task_type", "capability"])
async def test_acquire_never_leases_a_task_the_worker_cannot_run_even_its_organisations_first(
        world: World, pool: Any, mismatch: str) -> None:
    """The organisation's oldest, most urgent tasks need another type (or a capability the
    worker lacks); the worker is leased the one task it can run, and the others stay pending
    (the lock statement filters them itself, not only the query that picks the organisation)."""
    worker = await world.worker(capacity=2, task_types=("probe",), capabilities=("ipv4",))
    spec: dict[str, Any] = ({"task_type": "dns"} if mismatch == "task_type"
                            else {"required_capabilities": ("ipv4", "ipv6")})
    others = [await world.task(priority=9, **spec) for _ in range(3)]
    world.clock.advance(1)
    mine = await world.task(priority=0, required_capabilities=("ipv4",))
    acquired = await world.lifecycle.acquire(worker)
    assert acquired is not None and acquired.task.id == mine
    assert await world.lifecycle.acquire(worker) is None
    assert await scalar(pool, "SELECT array_agg(state::text) FROM worker_tasks WHERE id = ANY(%s)",
                        others) == ["pending"] * 3


async def test_acquire_respects_capacity_and_priority(world: World) -> None:
    worker = await world.worker(capacity=2)
    low = await world.task(priority=1)
    high = await world.task(priority=9)
    third = await world.task(priority=5)
    first = await world.lifecycle.acquire(worker)
    second = await world.lifecycle.acquire(worker)
    assert first is not None and second is not None
    assert [first.task.id, second.task.id] == [high, third]
    assert await world.lifecycle.acquire(worker) is None  # at capacity: the low one waits
    assert low not in (first.task.id, second.task.id)


async def test_unknown_worker_is_not_found(world: World) -> None:
    with pytest.raises(NotFound):
        await world.lifecycle.acquire(uuid4())


# leased -> running --------------------------------------------------------------------------


async def test_progress_starts_the_task_and_repeating_it_is_idempotent(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.leased(worker)
    task = await world.lifecycle.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
    assert task.state == "running" and task.current_attempt and task.current_attempt.status == "running"
    before = await event_count(pool)
    again = await world.lifecycle.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
    assert again.state == "running" and await event_count(pool) == before


async def test_first_result_batch_also_starts_the_task(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.leased(worker)
    ack: Any = await world.final_batch(worker, a)
    assert ack.task.state == "running"
    assert await topics(pool, a.task.id) == ["TaskCreated", "TaskLeased", "TaskStarted", "ResultBatchAccepted"]


# running -> running (renew) -------------------------------------------------------------------


async def test_renew_extends_the_lease_and_is_safe_to_repeat(world: World) -> None:
    worker = await world.worker()
    a = await world.running(worker, lease_seconds=30)
    world.clock.advance(20)
    renewed = await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
    assert not renewed.cancel_requested
    assert renewed.task.current_attempt is not None
    assert renewed.task.current_attempt.lease_expires_at == world.clock.now + timedelta(seconds=30)
    again = await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
    assert again.task.current_attempt == renewed.task.current_attempt


async def test_renew_is_capped_at_and_refused_after_the_deadline(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker, lease_seconds=60, execution_timeout_seconds=90)
    world.clock.advance(50)
    renewed = await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
    assert renewed.task.current_attempt is not None
    assert renewed.task.current_attempt.lease_expires_at == a.attempt.deadline_at
    world.clock.advance(45)  # past the deadline, lease also gone
    with pytest.raises(DeadlineExceeded):
        await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
    assert (await topics(pool, a.task.id))[-1] == "WriteRejected"


async def test_deadline_checked_even_when_renewed_on_time(world: World, pool: Any) -> None:
    """Renewed on time, the lease runs exactly to the deadline: at that instant the write is
    refused for the deadline (409 deadline-exceeded), not as a lost lease."""
    worker = await world.worker()
    a = await world.running(worker, lease_seconds=60, execution_timeout_seconds=100)
    world.clock.advance(50)
    await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)  # lease to t=100
    world.clock.advance(49.999)
    await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)  # still on time
    world.clock.advance(0.001)  # exactly the deadline; the lease ends at the same instant
    with pytest.raises(DeadlineExceeded) as refused:
        await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
    assert refused.value.details["reason"] == "deadline_passed"
    assert await scalar(pool, "SELECT data->>'reason' FROM analyst_events WHERE event_type = 'WriteRejected'") == (
        "deadline_passed")


# running -> completed -----------------------------------------------------------------------


async def test_complete_needs_a_final_batch_then_completes_once(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    with pytest.raises(InvalidTransition):
        await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)
    await world.final_batch(worker, a)
    done = await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)
    assert done.state == "completed"
    before = await event_count(pool)
    again = await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)
    assert again.state == "completed" and await event_count(pool) == before
    assert await scalar(pool, "SELECT status FROM worker_task_attempts") == "succeeded"
    assert await scalar(pool, "SELECT status FROM scan_jobs") == "success"
    assert await scalar(pool, "SELECT status FROM scans") == "success"


# result batches -----------------------------------------------------------------------------


async def test_same_key_same_sha_returns_the_original_acknowledgement(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    records = [{"type": "asset", "kind": "host", "value": "10.0.0.1"}]
    first: Any = await world.lifecycle.submit_batch(
        worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=1, idempotency_key="batch-1",
        payload_sha256=payload_sha256(records), records=records, final=False)
    before = await event_count(pool)
    again: Any = await world.lifecycle.submit_batch(
        worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=1, idempotency_key="batch-1",
        payload_sha256=payload_sha256(records), records=records, final=False)
    assert again.duplicate and not first.duplicate
    assert again.batch == first.batch
    assert await event_count(pool) == before
    assert await scalar(pool, "SELECT count(*) FROM worker_result_batches") == 1


async def test_same_key_other_sha_is_a_conflict(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    await world.final_batch(worker, a, [{"type": "raw", "n": 1}], key="k")
    other = [{"type": "raw", "n": 2}]
    with pytest.raises(IdempotencyConflict):
        await world.lifecycle.submit_batch(
            worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=1, idempotency_key="k",
            payload_sha256=payload_sha256(other), records=other, final=True)
    assert await scalar(pool, "SELECT count(*) FROM worker_result_batches") == 1
    assert (await topics(pool, a.task.id))[-1] == "WriteRejected"


async def test_payload_not_matching_its_sha_changes_nothing(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    before = await event_count(pool)
    with pytest.raises(InvalidRequest):
        await world.lifecycle.submit_batch(
            worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=1, idempotency_key="k",
            payload_sha256="0" * 64, records=[{"type": "raw"}], final=True)
    assert await event_count(pool) == before
    assert await scalar(pool, "SELECT count(*) FROM result_payloads") == 0


async def test_batches_in_sequence_and_none_after_the_final(world: World) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    records: list[object] = [{"type": "raw"}]
    sha = payload_sha256(records)
    lc = world.lifecycle
    with pytest.raises(InvalidTransition):
        await lc.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=2,
                              idempotency_key="b2", payload_sha256=sha, records=records, final=False)
    await lc.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=1,
                          idempotency_key="b1", payload_sha256=sha, records=records, final=True)
    with pytest.raises(LeaseLost):
        await lc.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=2,
                              idempotency_key="b2", payload_sha256=sha, records=records, final=False)


# -> retry_wait / failed_terminal --------------------------------------------------------------


async def test_expired_lease_goes_to_retry_wait_with_backoff_then_is_leased_again(world: World,
                                                                                  pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker, lease_seconds=10, max_attempts=2)
    world.clock.advance(11)
    assert await world.lifecycle.expire_leases() == 1
    assert await scalar(pool, "SELECT state FROM worker_tasks") == "retry_wait"
    assert await scalar(pool, "SELECT status FROM worker_task_attempts") == "expired"
    assert await world.lifecycle.expire_leases() == 0  # safe to repeat
    assert await world.lifecycle.acquire(worker) is None  # backoff: not available yet
    world.clock.advance(3)
    again = await world.lifecycle.acquire(worker)
    assert again is not None and again.attempt.attempt_number == 2 and again.task.id == a.task.id


class FixedDraw(random.Random):
    """A random source whose every draw is ``value``: the jitter a retry's backoff must show."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


async def test_retry_backoff_carries_the_gateways_jitter_draw(world: World, pool: Any) -> None:
    """The backoff is ``base * 2**(n-1) * (1 - jitter * draw)`` with the Gateway's own draw, both
    for a worker's retryable failure and for the sweeper's lease expiry: with a draw of 0.75 the
    default policy (2 s base, jitter 0.5) waits 1.25 s after the first attempt and 2.5 s after the
    second, not the undrawn 2 s and 4 s."""
    world.lifecycle.rng = FixedDraw(0.75)
    worker = await world.worker()
    a = await world.running(worker, lease_seconds=10, max_attempts=3)
    failed_at = world.clock.now
    t = await world.lifecycle.fail(worker, a.task.id, a.attempt.id, a.lease_token, error="boom")
    assert t.state == "retry_wait" and t.available_at == failed_at + timedelta(seconds=1.25)
    assert await scalar(pool, "SELECT available_at FROM worker_tasks") == failed_at + timedelta(seconds=1.25)
    world.clock.advance(1.25)
    b = await world.lifecycle.acquire(worker)
    assert b is not None and b.attempt.attempt_number == 2
    world.clock.advance(10)
    swept_at = world.clock.now
    assert await world.lifecycle.expire_leases() == 1
    assert await scalar(pool, "SELECT available_at FROM worker_tasks") == swept_at + timedelta(seconds=2.5)


async def test_expired_lease_with_attempts_exhausted_is_terminal(world: World, pool: Any) -> None:
    worker = await world.worker()
    await world.leased(worker, lease_seconds=10, max_attempts=1)
    world.clock.advance(10)
    assert await world.lifecycle.expire_leases() == 1
    assert await scalar(pool, "SELECT state FROM worker_tasks") == "failed_terminal"
    assert await scalar(pool, "SELECT status FROM scan_jobs") == "failed"
    assert await scalar(pool, "SELECT status FROM scans") == "failed"


async def test_retryable_failure_retries_and_terminal_failure_ends(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker, max_attempts=3)
    t = await world.lifecycle.fail(worker, a.task.id, a.attempt.id, a.lease_token, error="boom")
    assert t.state == "retry_wait" and t.last_error == "boom"
    before = await event_count(pool)
    again = await world.lifecycle.fail(worker, a.task.id, a.attempt.id, a.lease_token, error="boom")
    assert again.state == "retry_wait" and await event_count(pool) == before  # repeat returns state
    world.clock.advance(5)
    b = await world.lifecycle.acquire(worker)
    assert b is not None
    t = await world.lifecycle.fail(worker, b.task.id, b.attempt.id, b.lease_token, error="bad input",
                                   retryable=False)
    assert t.state == "failed_terminal"
    assert await scalar(pool, "SELECT status FROM scan_jobs") == "failed"


async def test_deadline_sweeper_ends_an_attempt_renewed_on_time_as_a_timeout(world: World, pool: Any) -> None:
    """Attempts remain, yet the deadline is a policy limit: attempt ``timeout``, task terminal,
    job ``timeout``, one ``AttemptTimedOut`` event; a late write is refused for the deadline."""
    worker = await world.worker()
    a = await world.running(worker, lease_seconds=60, execution_timeout_seconds=90, max_attempts=3)
    world.clock.advance(50)
    await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
    world.clock.advance(41)
    assert await world.lifecycle.expire_leases() == 1  # the lease ended with the deadline: either sweep
    assert await world.lifecycle.exceed_deadlines() == 0  # ... ends it once
    assert await scalar(pool, "SELECT state FROM worker_tasks") == "failed_terminal"
    assert await scalar(pool, "SELECT status FROM worker_task_attempts") == "timeout"
    assert await scalar(pool, "SELECT status FROM scan_jobs") == "timeout"
    assert (await topics(pool, a.task.id))[-1] == "AttemptTimedOut"
    assert await scalar(pool, "SELECT reason FROM attempt_failures") == "execution deadline exceeded"
    assert await scalar(pool, "SELECT row(timed_out, failed, expired, attempt_failure_rate)::text"
                              " FROM task_type_reliability") == "(1,0,0,1.0000)"
    with pytest.raises(DeadlineExceeded):
        await world.lifecycle.fail(worker, a.task.id, a.attempt.id, a.lease_token, error="late")


# cancellation -------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["pending", "retry_wait"])
async def test_cancel_before_acquire_cancels_at_once(world: World, pool: Any, state: str) -> None:
    worker = await world.worker()
    if state == "pending":
        task_id = await world.task()
    else:
        a = await world.running(worker)
        await world.lifecycle.fail(worker, a.task.id, a.attempt.id, a.lease_token, error="x")
        task_id = a.task.id
    t = await world.lifecycle.request_cancel(task_id)
    assert t.state == "cancelled"
    before = await event_count(pool)
    assert (await world.lifecycle.request_cancel(task_id)).state == "cancelled"
    assert await event_count(pool) == before
    assert await scalar(pool, "SELECT status FROM scan_jobs") == "cancelled"
    assert await world.lifecycle.acquire(worker) is None


async def test_cancel_running_task_goes_through_cancelling(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    assert (await world.lifecycle.request_cancel(a.task.id)).state == "cancelling"
    before = await event_count(pool)
    assert (await world.lifecycle.request_cancel(a.task.id)).state == "cancelling"
    assert await event_count(pool) == before
    renewed = await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
    assert renewed.cancel_requested
    with pytest.raises(TaskWasCancelled):
        await world.final_batch(worker, a)
    with pytest.raises(TaskWasCancelled):
        await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)
    done = await world.lifecycle.acknowledge_cancel(worker, a.task.id, a.attempt.id, a.lease_token)
    assert done.state == "cancelled"
    again = await world.lifecycle.acknowledge_cancel(worker, a.task.id, a.attempt.id, a.lease_token)
    assert again.state == "cancelled"
    assert await scalar(pool, "SELECT status FROM worker_task_attempts") == "cancelled"
    assert await scalar(pool, "SELECT count(*) FROM worker_result_batches") == 0


async def test_renew_while_cancelling_does_not_extend_the_lease(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    await world.lifecycle.request_cancel(a.task.id)
    expires = await scalar(pool, "SELECT lease_expires_at FROM worker_task_attempts")
    world.clock.advance(10)
    renewed = await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
    assert renewed.cancel_requested
    assert await scalar(pool, "SELECT lease_expires_at FROM worker_task_attempts") == expires


async def test_unacknowledged_cancel_is_terminated_by_the_gateway(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker, lease_seconds=600)
    await world.lifecycle.request_cancel(a.task.id)
    world.clock.advance(29)
    assert await world.lifecycle.terminate_cancelling() == 0
    world.clock.advance(2)
    assert await world.lifecycle.terminate_cancelling() == 1
    assert await scalar(pool, "SELECT state FROM worker_tasks") == "cancelled"
    assert await scalar(pool, "SELECT status FROM worker_task_attempts") == "cancelled"
    assert await scalar(pool, "SELECT status FROM scans") == "cancelled"


# stale and foreign writes -------------------------------------------------------------------


async def test_wrong_token_is_rejected_and_recorded(world: World, pool: Any) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    before = await event_count(pool)
    with pytest.raises(LeaseLost):
        await world.lifecycle.complete(worker, a.task.id, a.attempt.id, "not-the-token")
    assert await event_count(pool) == before + 1
    assert (await topics(pool, a.task.id))[-1] == "WriteRejected"
    assert await scalar(pool, "SELECT state FROM worker_tasks") == "running"


async def test_another_workers_attempt_is_not_found_and_nothing_is_recorded(world: World, pool: Any) -> None:
    owner = await world.worker()
    intruder = await world.worker()
    a = await world.running(owner)
    before = await event_count(pool)
    with pytest.raises(NotFound):
        await world.lifecycle.renew(intruder, a.task.id, a.attempt.id, a.lease_token)
    with pytest.raises(NotFound):
        await world.lifecycle.renew(owner, uuid4(), a.attempt.id, a.lease_token)
    assert await event_count(pool) == before
