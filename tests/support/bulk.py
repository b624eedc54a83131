"""Tasks in the states a bulk operation acts on, made quickly through the service layer."""

from __future__ import annotations

import uuid
from uuid import UUID

from leasehold.gateway.commands.lifecycle import TaskSpec
from leasehold.gateway.services import Services


async def failed_tasks(services: Services, org: UUID, scan: UUID, count: int, *,
                       task_type: str = "flaky") -> list[UUID]:
    """``count`` tasks of ``scan`` and type ``task_type``, each failed for good by a worker that
    runs only that type (one attempt, not retryable): ``failed_terminal``, what a bulk retry takes.
    Concurrent calls need a type each."""
    spec = TaskSpec(task_type=task_type, max_attempts=1, lease_seconds=60, execution_timeout_seconds=600)
    worker = await services.registry.register_worker(name=f"bulk-{uuid.uuid4().hex[:8]}",
                                                     fingerprint=uuid.uuid4().hex * 2, task_types=(task_type,),
                                                     max_concurrent_tasks=1)
    await services.registry.assign_worker(worker, org)
    made = [(await services.lifecycle.create_task(scan, spec)).id for _ in range(count)]  # the scan stays open
    for _ in range(count):
        acquired = await services.lifecycle.acquire(worker)
        assert acquired is not None and acquired.task.id in made
        await services.lifecycle.fail(worker, acquired.task.id, acquired.attempt.id, acquired.lease_token,
                                      error="plugin crashed", retryable=False)
    return made
