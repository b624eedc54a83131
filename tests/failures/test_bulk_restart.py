"""A bulk retry survives its Gateway's SIGKILL halfway: another Gateway carries it on once the
dead one's hold has run out, and every task is retried exactly once (the task's command and the
operation's record of it commit together)."""

from __future__ import annotations

from pathlib import Path

import pytest

from leasehold.gateway.commands.lifecycle import TaskSpec
from leasehold.gateway.tls import PkiPaths
from support.bulk import failed_tasks
from support.gateway import GatewayProcess
from support.services import wall_clock_services
from support.waits import wait_until

pytestmark = pytest.mark.slow

TASKS = 400
OPTIONS = {"bulk_hold_seconds": 2, "bulk_interval_seconds": 0.5, "bulk_batch": 50}


async def test_a_bulk_retry_killed_halfway_ends_with_each_task_retried_once(
        database_url: str, pki: PkiPaths, tmp_path: Path) -> None:
    async with wall_clock_services(database_url) as services:
        org = await services.registry.create_organization("bulk-restart")
        scan = await services.scans.create_scan(org, {"targets": ["192.0.2.10"]})
        await services.lifecycle.create_task(scan, TaskSpec(task_type="hold"))  # keeps the scan open
        failed = await failed_tasks(services, org, scan, TASKS)
        first = GatewayProcess(database_url, pki, tmp_path / "gateway-1.log", dict(OPTIONS))
        await first.start()
        view = first.client(services, org, scan)
        try:
            started = await view.operator("POST", "/v1/bulk-operations", {
                "action": "retry", "filter": {"organization_id": str(org), "state": "failed_terminal"}})
            assert started.status == 202 and started.body["total"] == TASKS, started.body
            operation = started.body["id"]

            async def halfway() -> bool:
                reply = await view.operator("GET", f"/v1/bulk-operations/{operation}")
                return TASKS // 4 <= reply.body["done"] < TASKS

            await wait_until(halfway, 60, what="the operation to be under way", interval=0.02)
            await first.kill()
        finally:
            for session in view.sessions:
                await session.close()
            await first.kill()
        reached = int(await view.count("SELECT count(*) FROM bulk_operation_tasks"))
        assert 0 < reached < TASKS, reached  # killed with work left

        second = GatewayProcess(database_url, pki, tmp_path / "gateway-2.log", dict(OPTIONS))
        await second.start()
        view = second.client(services, org, scan)
        try:
            async def over() -> dict[str, object] | None:
                reply = await view.operator("GET", f"/v1/bulk-operations/{operation}")
                return reply.body if reply.body["status"] == "finished" else None

            end = await wait_until(over, 120, what="the second Gateway to finish the operation")
        finally:
            for session in view.sessions:
                await session.close()
            await second.stop()
        assert (end["done"], end["skipped"], end["failed"]) == (TASKS, 0, 0), end
        retried = await view.count(
            "SELECT count(DISTINCT originator_id) FILTER (WHERE n = 1) || '/' || count(*) FROM ("
            " SELECT originator_id, count(*) AS n FROM events WHERE topic LIKE '%%TaskRetried' GROUP BY 1) x")
        assert retried == f"{TASKS}/{TASKS}", retried  # each of the tasks, once
        assert int(await view.count("SELECT count(*) FROM worker_tasks WHERE state = 'pending' AND task_type = "
                                    "'flaky'")) == len(failed)
