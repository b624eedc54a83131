"""Scheduled scans over HTTP: the Gateway's scheduler loop starts due scans; pause, resume,
run-now and delete are org-scoped."""

from __future__ import annotations

from support.gateway import RunningGateway
from support.waits import wait_until


async def test_schedule_lifecycle_and_the_scheduler_loop(gateway: RunningGateway) -> None:
    r = await gateway.operator("POST", "/v1/organizations", {"name": "schedule-tenant"})
    org = r.body["id"]
    key = (await gateway.operator("POST", f"/v1/organizations/{org}/api-keys", {"name": "k"})).body["key"]
    r = await gateway.operator("POST", "/v1/schedules", {
        "name": "every second", "interval_seconds": 1, "targets": {"targets": ["192.0.2.10"]},
        "profile": [{"task_type": "probe"}]}, key=key)
    assert r.status == 201 and r.body["enabled"] and r.body["organization_id"] == org, r.body
    sid = r.body["id"]

    async def fired() -> bool:
        return bool((await gateway.operator("GET", f"/v1/schedules/{sid}", key=key)).body["last_run_at"])

    await wait_until(fired, 10, what="the Gateway's own scheduler loop to fire the schedule", interval=0.1)
    assert await gateway.count("SELECT count(*) FROM scans WHERE organization_id = %s", org) >= 1

    r = await gateway.operator("POST", f"/v1/schedules/{sid}/pause", key=key)
    assert r.status == 200 and not r.body["enabled"]
    r = await gateway.operator("POST", f"/v1/schedules/{sid}/run-now", key=key)
    assert r.status == 201, r.body
    scan = (await gateway.operator("GET", f"/v1/scans/{r.body['scan_id']}", key=key)).body
    assert scan["organization_id"] == org and scan["targets"] == {"targets": ["192.0.2.10"]}
    assert (await gateway.operator("POST", f"/v1/schedules/{sid}/resume", key=key)).body["enabled"]
    assert [s["id"] for s in (await gateway.operator("GET", "/v1/schedules", key=key)).body["items"]] == [sid]

    bad = await gateway.operator("POST", "/v1/schedules", {
        "name": "both", "interval_seconds": 60, "cron": "* * * * *", "profile": [{"task_type": "probe"}]},
        key=key)
    assert bad.status in (400, 422), bad.body
    assert (await gateway.operator("DELETE", f"/v1/schedules/{sid}", key=key)).status == 200
    assert (await gateway.operator("GET", f"/v1/schedules/{sid}", key=key)).status == 404
    assert (await gateway.operator("GET", "/v1/schedules", key=key)).body["items"] == []
