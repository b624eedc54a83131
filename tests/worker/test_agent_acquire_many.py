"""The agent asks for several tasks per request and carries its next acquire on each task's
ending write (``acquire_many``), against a real Gateway with real plugin subprocesses: a busy
worker makes about one request per task, never runs more than its capacity, and with the
setting off it acquires one task per request as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from leasehold.gateway.api import worker as worker_api
from leasehold.gateway.keys import METRICS
from support.agent import register_worker, running_agent, write_plugin
from support.gateway import RunningGateway
from support.waits import wait_until

ROUTES = ("/v1/tasks/acquire", "/v1/tasks/{task_id}/attempts/{attempt_id}/complete",
          "/v1/tasks/{task_id}/attempts/{attempt_id}/progress")


def requests(gateway: RunningGateway) -> dict[str, float]:
    """The worker API's answered requests so far, by route."""
    registry = gateway.app[METRICS].registry
    counts = dict.fromkeys(ROUTES, 0.0)
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == "leasehold_http_requests_total" and sample.labels["route"] in counts:
                counts[sample.labels["route"]] += sample.value
    return counts


async def completed(gateway: RunningGateway) -> int:
    return int(await gateway.count("SELECT count(*) FROM worker_tasks WHERE state = 'completed'"))


async def run_tasks(gateway: RunningGateway, plugins_dir: Path, *, tasks: int, many: bool) -> dict[str, float]:
    write_plugin(plugins_dir, "quick", """
        #!/bin/sh
        echo '{"type": "raw", "ok": true}'
    """)
    worker = await register_worker(gateway, ("quick",), capacity=3)
    peak = 0
    before = requests(gateway)
    for _ in range(tasks):
        await gateway.task(task_type="quick")
    async with running_agent(worker.settings(gateway, plugins_dir=plugins_dir, max_concurrency=3,
                                             acquire_many=many)) as agent:
        async def done() -> bool:
            nonlocal peak
            peak = max(peak, len(agent.runners))
            return await completed(gateway) == tasks

        await wait_until(done, 60, what=f"{tasks} tasks completed")
    assert peak <= 3
    live = await gateway.count("SELECT count(*) FROM worker_task_attempts WHERE status IN ('leased', 'running')")
    assert live == 0
    after = requests(gateway)
    return {route: after[route] - before[route] for route in ROUTES}


async def test_a_busy_agent_makes_about_one_request_per_task(gateway: RunningGateway, plugins_dir: Path) -> None:
    made = await run_tasks(gateway, plugins_dir, tasks=24, many=True)
    # Every task: its progress and its completion (carrying the final batch and the next
    # acquire); the acquires themselves are the first one and those after an empty carry.
    assert made["/v1/tasks/{task_id}/attempts/{attempt_id}/complete"] == 24
    assert made["/v1/tasks/acquire"] <= 8, made
    leased_many = await gateway.count("SELECT count(*) FROM worker_task_attempts WHERE acquire_request_id LIKE '%%#%%'")
    assert leased_many > 0  # some request granted more than one lease


async def test_with_acquire_many_off_every_task_has_its_own_acquire(gateway: RunningGateway,
                                                                  plugins_dir: Path) -> None:
    made = await run_tasks(gateway, plugins_dir, tasks=6, many=False)
    assert made["/v1/tasks/acquire"] >= 6
    assert await gateway.count("SELECT count(*) FROM worker_task_attempts WHERE acquire_request_id LIKE '%%#%%'") == 0


async def test_an_agent_facing_a_gateway_without_the_fields_falls_back_to_one_task(
        gateway: RunningGateway, plugins_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Gateway from before several tasks per request refuses the unknown fields (422): the agent
    then acquires one task per request and carries nothing, and every task completes."""
    original = worker_api.read_json
    refused: list[str] = []

    async def older_gateway(request: Any, model: Any) -> Any:
        parsed = await original(request, model)
        if getattr(parsed, "max_tasks", None) is not None or getattr(parsed, "acquire", None) is not None:
            refused.append(model.__name__)
            model.model_validate({"a_field_an_older_gateway_does_not_know": 1})  # its 422
        return parsed

    monkeypatch.setattr(worker_api, "read_json", older_gateway)
    made = await run_tasks(gateway, plugins_dir, tasks=4, many=True)
    assert refused == ["AcquireRequest"]  # once; nothing carried afterwards
    assert made["/v1/tasks/{task_id}/attempts/{attempt_id}/complete"] == 4
    assert await gateway.count("SELECT count(*) FROM worker_task_attempts WHERE acquire_request_id LIKE '%%#%%'") == 0
