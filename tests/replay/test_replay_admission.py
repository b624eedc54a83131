"""``leasehold replay verify-admission``: every task and scan the admission caps govern, re-derived
from the log after racing creators (the caps in force, what was queued before each), and the caps'
projection rebuilt equal to the live one."""

from __future__ import annotations

import asyncio

from replay_support import cli_json

from leasehold.domain.admission import AdmissionRefused
from leasehold.gateway.commands.lifecycle import TaskSpec
from support.core import World, assert_log_rebuilds_live


async def test_the_log_rederives_every_admission_decision(world: World, database_url: str) -> None:
    scan = await world.scans.create_scan(world.org, {"targets": ["10.0.0.1"]})
    await world.registry.set_admission(world.org, max_queued_tasks=3, max_queued_scans=None, reason="replay")
    spec = TaskSpec(task_type="probe", lease_seconds=60, execution_timeout_seconds=600)
    results = await asyncio.gather(*(world.lifecycle.create_task(scan, spec) for _ in range(12)),
                                   return_exceptions=True)
    assert sum(isinstance(r, AdmissionRefused) for r in results) == 9

    code, report = await cli_json("replay", "verify-admission", "--database-url", database_url)
    assert (code, report["ok"], report["past_cap"]) == (0, True, [])
    assert report["capped"] == 3 and report["creations"] >= 4  # world's own scan and task, the admitted three
    await assert_log_rebuilds_live(database_url)
