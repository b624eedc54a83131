"""The agent checks a task's targets against its organisation's target policy after resolving
their names, before the plugin runs: a task aimed at loopback or cloud metadata (accepted when
the policy allowed it, leased after it no longer does) fails without its plugin ever starting."""

from __future__ import annotations

from pathlib import Path

from leasehold.domain.targets import DEFAULT_POLICY, parse_policy
from support.agent import register_worker, running_agent, task_state, wait_state, write_plugin
from support.gateway import RunningGateway


async def test_the_agent_refuses_local_targets_under_the_default_policy(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    write_plugin(plugins_dir, "probe", f"""
        #!/bin/sh
        echo ran >> {ran}
        echo '{{"type": "raw", "ok": true}}'
    """)
    registry = gateway.registry
    await registry.set_target_policy(gateway.org, parse_policy(allow=["127.0.0.0/8", "169.254.0.0/16"]))
    aimed = {target: await gateway.task(scope={"targets": [target]})
             for target in ("127.0.0.1", "169.254.169.254", "localhost", "http://localhost:8080/")}
    await registry.set_target_policy(gateway.org, DEFAULT_POLICY)  # the lease carries the policy of its time
    ordinary = await gateway.task(scope={"targets": ["192.0.2.10"]})
    worker = await register_worker(gateway, ("probe",), capacity=2)
    async with running_agent(worker.settings(gateway, plugins_dir=plugins_dir, wait_seconds=1)):
        assert await wait_state(gateway, ordinary, "completed") == "completed"
        for target, task_id in aimed.items():
            assert await wait_state(gateway, task_id, "failed_terminal") == "failed_terminal", target
    for target, task_id in aimed.items():
        state, attempts, error = await task_state(gateway, task_id)
        assert (state, attempts) == ("failed_terminal", 1), target
        assert error is not None and "target policy" in error and target in error, (target, error)
    assert ran.read_text().splitlines() == ["ran"]  # only the ordinary task's plugin ever ran
