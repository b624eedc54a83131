"""The real worker agent next to poison: a task nesting too deep is refused at creation, one
stored before the limits existed is listed by migration 0022 and cancelled by the Gateway before
any acquire meets it, and the ordinary tasks around them flow to completion."""

from __future__ import annotations

from pathlib import Path

from support.agent import register_worker, running_agent, task_state, wait_state, write_plugin
from support.gateway import RunningGateway
from support.migrations import revision_module


async def test_the_agent_works_through_ordinary_tasks_around_poison(
        gateway: RunningGateway, plugins_dir: Path) -> None:
    write_plugin(plugins_dir, "probe", """
        #!/bin/sh
        echo '{"type": "raw", "ok": true}'
    """)
    deep = b'{"a":' * 251 + b"{}" + b"}" * 251
    refused = await gateway.operator("POST", f"/v1/scans/{gateway.scan}/tasks",
                                     raw=b'{"task_type": "probe", "scope": ' + deep + b"}")
    assert refused.status == 422, refused.body
    before = [await gateway.task() for _ in range(3)]
    stored = await gateway.task(priority=5)  # written past the limits below, as if stored before them
    async with gateway.pool.connection() as conn:
        await conn.execute("UPDATE worker_tasks SET scope = %s::jsonb WHERE id = %s",
                           ('{"a": ' * 300 + "1" + "}" * 300, stored))
        await conn.execute(revision_module("0022_undeliverable_tasks.py").LIST)  # what the migration finds
    # What the Gateway does at startup, before it serves.
    assert await gateway.lifecycle.end_undeliverable() == [stored]
    after = [await gateway.task() for _ in range(3)]
    worker = await register_worker(gateway, ("probe",), capacity=2)
    async with running_agent(worker.settings(gateway, plugins_dir=plugins_dir, wait_seconds=1)):
        for task_id in [*before, *after]:
            assert await wait_state(gateway, task_id, "completed", within=30) == "completed"
    assert (await task_state(gateway, stored))[:2] == ("cancelled", 0)
    assert await gateway.count("SELECT count(*) FROM worker_tasks") == 7
