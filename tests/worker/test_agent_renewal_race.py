"""A renewal still in flight when the plugin finishes: the agent has it answered before it sends
the completion, so it never reaches the Gateway after the completion (where it would be refused
with 409 as a write on a finished attempt, and recorded as ``WriteRejected``).

The renewal is held in flight by the test: the agent's ``GatewayClient.renew`` is wrapped so that
the first renewal lets the plugin finish and is put on the wire (a task of its own, which the
agent cannot call back), where it waits until either the completion has been
answered (an agent that does not wait) or the agent is waiting for this renewal before it sends
the completion (an agent that does), and only then goes to the real Gateway over mTLS.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from leasehold.worker.client import GatewayClient
from support.agent import (
    attempts,
    python_plugin,
    register_worker,
    rows,
    running_agent,
    task_state,
    wait_state,
)
from support.gateway import RunningGateway
from support.waits import wait_until


async def test_a_renewal_in_flight_when_the_plugin_finishes_is_answered_before_the_completion(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    go = tmp_path / "go"
    python_plugin(plugins_dir, "held", f"""
        import json, os, time
        while not os.path.exists({str(go)!r}):  # the plugin finishes when the test says so
            time.sleep(0.02)
        print(json.dumps({{"type": "raw", "n": 1}}), flush=True)
    """)
    worker = await register_worker(gateway, ("held",))
    task_id = await gateway.task(task_type="held", lease_seconds=3)  # first renewal after 1 s

    calls: list[str] = []  # renew/complete, in the order they were answered
    renew_errors: list[BaseException] = []
    holding = asyncio.Event()
    original_renew, original_complete = GatewayClient.renew, GatewayClient.complete
    agent_box: list[Any] = []
    on_the_wire: list[asyncio.Task[Any]] = []

    def waiting_for_the_renewal() -> bool:
        """The agent decided to complete and is waiting for the renewal in flight to be answered."""
        return any(getattr(runner, "_closing", False) for runner in agent_box[0].runners.values())

    async def renew(self: GatewayClient, attempt: Any, **kwargs: Any) -> Any:
        if holding.is_set():
            return await forward(self, attempt, **kwargs)
        holding.set()
        go.touch()  # the plugin ends while this renewal is in flight
        # Sent is sent: the request travels on even if the agent stops waiting for its answer.
        on_the_wire.append(asyncio.create_task(held(self, attempt, **kwargs)))
        return await asyncio.shield(on_the_wire[0])

    async def held(self: GatewayClient, attempt: Any, **kwargs: Any) -> Any:
        await wait_until(lambda: "complete" in calls or waiting_for_the_renewal(), timeout=20,
                         interval=0.01, what="the completion answered, or the agent waiting for this renewal")
        return await forward(self, attempt, **kwargs)

    async def forward(self: GatewayClient, attempt: Any, **kwargs: Any) -> Any:
        try:
            answer = await original_renew(self, attempt, **kwargs)
        except BaseException as exc:
            renew_errors.append(exc)
            raise
        calls.append("renew")
        return answer

    async def complete(self: GatewayClient, attempt: Any, **kwargs: Any) -> Any:
        answer = await original_complete(self, attempt, **kwargs)
        calls.append("complete")
        return answer

    monkeypatch.setattr(GatewayClient, "renew", renew)
    monkeypatch.setattr(GatewayClient, "complete", complete)
    async with running_agent(worker.settings(gateway, plugins_dir=plugins_dir)) as agent:
        agent_box.append(agent)
        await wait_state(gateway, task_id, "completed", "failed_terminal", "retry_wait", within=30)
        await wait_until(lambda: "complete" in calls, what="the completion answered")
        await asyncio.wait(on_the_wire, timeout=20)  # the held renewal reached the Gateway too

    assert holding.is_set()  # a renewal was in flight when the plugin finished
    assert not renew_errors, renew_errors  # no 409 for the renewal
    assert calls[:2] == ["renew", "complete"], calls
    assert (await task_state(gateway, task_id))[0] == "completed"
    [attempt] = await attempts(gateway, task_id)
    assert attempt["status"] == "succeeded"
    [(rejected,)] = await rows(gateway, "SELECT count(*) FROM events WHERE originator_id = %s "
                                        "AND topic LIKE '%%WriteRejected'", task_id)
    assert rejected == 0
