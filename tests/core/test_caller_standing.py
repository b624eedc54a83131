"""Worker commands given the caller's certificate fingerprint check the worker's standing in
their own transaction: the Gateway relies on it to refuse a revoked or disabled worker on every
request without a transaction of its own per request (see ``gateway.auth.worker_identity``).
A refused caller changes nothing and records nothing."""

from __future__ import annotations

import hashlib
from uuid import UUID, uuid4

import pytest

from leasehold.domain.errors import Forbidden
from leasehold.domain.results import payload_sha256
from support.core import World, event_count

RECORDS = [{"type": "asset", "kind": "host", "value": "a.example.test"}]


async def _worker(world: World) -> tuple[UUID, str]:
    """A worker, and the fingerprint of its certificate."""
    fingerprint = hashlib.sha256(uuid4().bytes).hexdigest()
    return await world.worker(capacity=5, fingerprint=fingerprint), fingerprint


async def test_acquire_with_the_workers_own_certificate_leases(world: World) -> None:
    worker, fingerprint = await _worker(world)
    task = await world.task()
    acquired = await world.lifecycle.acquire(worker, fingerprint=fingerprint)
    assert acquired is not None and acquired.task.id == task


@pytest.mark.parametrize("standing", ["revoked", "disabled", "foreign", "unknown"])
async def test_acquire_refuses_a_caller_not_in_good_standing(world: World, standing: str) -> None:
    worker, fingerprint = await _worker(world)
    _, other_fingerprint = await _worker(world)
    await world.task()
    if standing == "revoked":
        await world.registry.revoke_worker(worker, reason="key leaked")
    elif standing == "disabled":
        await world.registry.set_worker_enabled(worker, False)
    caller = {"foreign": other_fingerprint, "unknown": "ab" * 32}.get(standing, fingerprint)
    before = await event_count(world.pool)
    with pytest.raises(Forbidden) as refused:
        await world.lifecycle.poll(worker, fingerprint=caller)
    expected = {"revoked": "revoked", "disabled": "disabled"}.get(standing, "does not belong")
    assert expected in str(refused.value)
    assert await event_count(world.pool) == before


@pytest.mark.parametrize("write", ["renew", "progress", "results", "complete", "fail", "cancel_ack"])
async def test_every_write_refuses_a_revoked_caller_before_reading_anything(world: World, write: str) -> None:
    worker, fingerprint = await _worker(world)
    await world.task()
    acquired = await world.lifecycle.acquire(worker, fingerprint=fingerprint)
    assert acquired is not None
    args = (worker, acquired.task.id, acquired.attempt.id, acquired.lease_token)
    await world.registry.revoke_worker(worker, reason="key leaked")
    before = await event_count(world.pool)
    lc = world.lifecycle
    with pytest.raises(Forbidden, match="revoked"):
        if write == "renew":
            await lc.renew(*args, fingerprint=fingerprint)
        elif write == "progress":
            await lc.mark_running(*args, fingerprint=fingerprint)
        elif write == "results":
            await lc.submit_batch(*args, sequence_number=1, idempotency_key="k", payload_sha256=payload_sha256(RECORDS),
                                  records=RECORDS, final=True, fingerprint=fingerprint)
        elif write == "complete":
            await lc.complete(*args, fingerprint=fingerprint)
        elif write == "fail":
            await lc.fail(*args, error="boom", fingerprint=fingerprint)
        else:
            await lc.acknowledge_cancel(*args, fingerprint=fingerprint)
    assert await event_count(world.pool) == before
    # Refused before the task was even read: a task id that does not exist gets the same 403.
    with pytest.raises(Forbidden):
        await lc.complete(worker, uuid4(), acquired.attempt.id, acquired.lease_token, fingerprint=fingerprint)
