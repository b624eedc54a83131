"""A connection lost at COMMIT is resolved before the worker is answered.

A PostgreSQL-aware proxy (``support.pgproxy``) sits between an in-process Gateway and its
database and drops the connection of one command's transaction at its COMMIT:

* ``after``: the server committed and the Gateway never heard so. The Gateway finds the
  transaction's last event in the log and answers what committed: 200, the write once.
* ``before``: the COMMIT never reached the server. The Gateway finds nothing in the log and runs
  the command again on a fresh connection: 200, the write once.

Either way the worker sees no error, and its own retry afterwards returns the same outcome
without a second event.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import pytest

from support.gateway import RunningGateway, WorkerClient, running_gateway
from support.pgproxy import Mode, pg_proxy

MODES: tuple[Mode, ...] = ("after", "before")


async def _events(gateway: RunningGateway, task_id: object, kind: str) -> int:
    return int(await gateway.count("SELECT count(*) FROM events WHERE originator_id = %s AND topic LIKE %s",
                                   task_id, f"%{kind}"))


@pytest.mark.parametrize("mode", MODES)
async def test_a_completion_lost_at_commit_answers_once(database_url: str, pki: Any, mode: Mode) -> None:
    parts = urlsplit(database_url)
    async with pg_proxy(parts.port or 5432) as proxy, \
            running_gateway(proxy.url(parts.path.lstrip("/")), pki) as gateway:
        worker = await gateway.worker()
        task_id = await gateway.task()
        lease = (await worker.acquire()).body["lease"]
        assert (await worker.final_batch(lease)).status == 200

        proxy.arm(mode, UUID(lease["attempt_id"]))
        done = await worker.write(lease, "complete")
        assert proxy.dropped == [mode]
        assert done.status == 200 and done.body["task"]["state"] == "completed", done.body
        assert await _events(gateway, task_id, "TaskCompleted") == 1

        again = await worker.write(lease, "complete")  # the worker's own retry: the same outcome
        assert again.status == 200 and again.body["task"]["state"] == "completed", again.body
        assert await _events(gateway, task_id, "TaskCompleted") == 1


@pytest.mark.parametrize("mode", MODES)
async def test_a_batch_lost_at_commit_is_accepted_once(database_url: str, pki: Any, mode: Mode) -> None:
    parts = urlsplit(database_url)
    async with pg_proxy(parts.port or 5432) as proxy, \
            running_gateway(proxy.url(parts.path.lstrip("/")), pki) as gateway:
        worker = await gateway.worker()
        task_id = await gateway.task()
        lease = (await worker.acquire()).body["lease"]

        proxy.arm(mode, UUID(lease["attempt_id"]))
        first = await worker.final_batch(lease, key="only")
        assert proxy.dropped == [mode]
        assert first.status == 200, first.body
        again = await worker.final_batch(lease, key="only")
        # The worker's own retry: the original acknowledgement, marked as a repeat.
        assert first.body["duplicate"] is False and again.body["duplicate"] is True, (first.body, again.body)
        assert again.status == 200 and {**again.body, "duplicate": False} == first.body, (first.body, again.body)
        assert await _events(gateway, task_id, "ResultBatchAccepted") == 1
        assert (await worker.write(lease, "complete")).status == 200


@pytest.mark.parametrize("mode", MODES)
async def test_an_acquire_lost_at_commit_leases_once(database_url: str, pki: Any, mode: Mode) -> None:
    """No request id: the Gateway's own resolution is all that keeps the lease from being made
    twice (a second lease would leave the first attempt to expire unused)."""
    parts = urlsplit(database_url)
    async with pg_proxy(parts.port or 5432) as proxy, \
            running_gateway(proxy.url(parts.path.lstrip("/")), pki) as gateway:
        worker = await gateway.worker()
        task_id = await gateway.task()
        other = await gateway.task()

        proxy.arm(mode, task_id)  # the lease's events name the task it leases
        acquired = await worker.acquire()
        assert proxy.dropped == [mode], "the acquire's COMMIT was not the one dropped"
        assert acquired.status == 200, acquired.body
        lease = acquired.body["lease"]
        assert lease is not None and lease["task"]["id"] == str(task_id), lease
        assert await _events(gateway, task_id, "TaskLeased") == 1
        assert await _events(gateway, other, "TaskLeased") == 0
        # The lease answered is the one that committed: it works.
        assert (await worker.final_batch(lease)).status == 200
        assert (await worker.write(lease, "complete")).status == 200


async def test_concurrent_commands_around_a_lost_commit(database_url: str, pki: Any) -> None:
    """Eight workers complete at once while one completion's COMMIT answer is lost: every one
    of them is answered 200 and every task completes exactly once."""
    parts = urlsplit(database_url)
    async with pg_proxy(parts.port or 5432) as proxy, \
            running_gateway(proxy.url(parts.path.lstrip("/")), pki) as gateway:
        workers: list[WorkerClient] = [await gateway.worker() for _ in range(8)]
        tasks = [await gateway.task() for _ in workers]
        leases = []
        for worker in workers:
            lease = (await worker.acquire()).body["lease"]
            assert (await worker.final_batch(lease)).status == 200
            leases.append(lease)
        proxy.arm("after", UUID(leases[3]["attempt_id"]))
        answers = await asyncio.gather(*(w.write(lease, "complete") for w, lease in zip(workers, leases, strict=True)))
        assert proxy.dropped == ["after"]
        assert [a.status for a in answers] == [200] * len(answers), [a.body for a in answers]
        for task_id in tasks:
            assert await _events(gateway, task_id, "TaskCompleted") == 1


@pytest.mark.parametrize("mode", MODES)
async def test_an_empty_acquire_lost_at_commit_answers_no_work(database_url: str, pki: Any, mode: Mode) -> None:
    """A transaction that only read loses nothing with its COMMIT: the answer (no work) stands,
    never a 503."""
    parts = urlsplit(database_url)
    async with pg_proxy(parts.port or 5432) as proxy, \
            running_gateway(proxy.url(parts.path.lstrip("/")), pki) as gateway:
        worker = await gateway.worker()
        proxy.arm(mode, worker.id)
        polled = await worker.acquire()
        assert proxy.dropped == [mode]
        assert polled.status == 204, polled.body
