"""Scans over HTTP: a profile scan runs step by step, its findings are readable (org-scoped),
and a scan can be cancelled."""

from __future__ import annotations

from support.gateway import RunningGateway


async def test_profile_scan_findings_and_cancel(gateway: RunningGateway) -> None:
    r = await gateway.operator("POST", "/v1/organizations", {"name": "scan-api-tenant"})
    assert r.status == 201, r.body
    org = r.body["id"]
    key = (await gateway.operator("POST", f"/v1/organizations/{org}/api-keys", {"name": "k"})).body["key"]
    other = (await gateway.operator("POST", "/v1/organizations", {"name": "scan-api-other"})).body["id"]
    worker = await gateway.worker(task_types=("discover", "vulnscan"), org=gateway.org)
    await gateway.registry.assign_worker(worker.id, org)

    r = await gateway.operator("POST", "/v1/scans", {"targets": {"targets": ["192.0.2.10"]}, "profile": [
        {"task_type": "discover"}, {"task_type": "vulnscan", "stop_on_failure": False}]}, key=key)
    assert r.status == 201 and r.body["status"] == "pending", r.body
    scan = r.body["id"]

    lease = (await worker.acquire()).body["lease"]
    assert lease["task"]["task_type"] == "discover"
    assert (await worker.write(lease, "progress")).status == 200
    records = [{"type": "asset", "kind": "host", "value": "a.example"},
               {"type": "threat", "external_id": "CVE-1", "title": "t"}]
    assert (await worker.final_batch(lease, records)).status == 200
    assert (await worker.final_batch(lease, records)).status == 200  # a retry: ingested once
    assert (await worker.write(lease, "complete")).status == 200

    assets = await gateway.operator("GET", f"/v1/scans/{scan}/assets", key=key)
    assert assets.status == 200 and [(a["kind"], a["value"]) for a in assets.body["items"]] == [
        ("host", "a.example")]
    org_assets = await gateway.operator("GET", f"/v1/organizations/{org}/assets", key=key)
    assert len(org_assets.body["items"]) == 1
    threats = await gateway.operator("GET", f"/v1/organizations/{org}/threats", key=key)
    assert [t["external_id"] for t in threats.body["items"]] == ["CVE-1"]
    assert (await gateway.operator("GET", f"/v1/organizations/{other}/assets", key=key)).status == 404
    assert (await gateway.operator("GET", f"/v1/organizations/{other}/threats", key=key)).status == 404

    # Step 2 was created by step 1's completion, scoped with what step 1 found; cancel the scan.
    lease = (await worker.acquire()).body["lease"]
    assert lease["task"]["task_type"] == "vulnscan"
    assert lease["task"]["scope"]["assets"] == [{"kind": "host", "value": "a.example"}]
    assert (await worker.write(lease, "progress")).status == 200
    r = await gateway.operator("POST", f"/v1/scans/{scan}/cancel", {}, key=key)
    assert r.status == 200 and [t["state"] for t in r.body["tasks"]] == ["cancelling"], r.body
    assert (await worker.write(lease, "cancel-ack")).body["task"]["state"] == "cancelled"
    assert (await gateway.operator("GET", f"/v1/scans/{scan}", key=key)).body["status"] == "cancelled"


async def test_steps_over_targets_that_select_nothing_are_refused_naming_the_keys(gateway: RunningGateway) -> None:
    from test_operator_api import assert_problem, changes

    before = await changes(gateway)
    steps = [{"task_type": "probe"}]
    for path, body, named in (
            ("/v1/scans", {"organization_id": str(gateway.org), "targets": {"hosts": ["192.0.2.10"]},
                           "profile": steps}, "hosts"),
            ("/v1/schedules", {"organization_id": str(gateway.org), "name": "nightly", "interval_seconds": 3600,
                               "targets": {"hosts": ["192.0.2.10"]}, "profile": steps}, "hosts"),
            ("/v1/scans", {"organization_id": str(gateway.org), "targets": {"ports": "80", "targets": []},
                           "profile": steps}, "ports, targets")):
        reply = await gateway.operator("POST", path, body)
        assert_problem(reply, 422)
        assert f"select nothing to scan (they have {named})" in reply.body["detail"], reply.body
    assert await changes(gateway) == before
    # What stays allowed: targets that select something, empty targets, and a scan without steps.
    for body in ({"targets": {"targets": ["192.0.2.10"]}, "profile": steps}, {"targets": {}, "profile": steps},
                 {"targets": {"hosts": ["192.0.2.10"]}}, {"targets": {"assets": [{"kind": "host", "value": "h"}]},
                                                          "profile": steps}):
        reply = await gateway.operator("POST", "/v1/scans", {"organization_id": str(gateway.org), **body})
        assert reply.status == 201, (body, reply.body)
