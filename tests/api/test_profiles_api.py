"""Stored profiles and execution modes over HTTP (a real Gateway, real TLS): profiles by name,
edits that never reach existing scans, tenant isolation, bad input, the flags, and a legacy
scan that no idle worker ever gets a task of."""

from __future__ import annotations

from typing import Any

from support.gateway import RunningGateway, assert_problem, events_logged, tenant

STEPS = [{"task_type": "discover", "lease_seconds": 300}, {"task_type": "portscan", "stop_on_failure": False}]


async def test_profiles_by_name_and_edits_that_never_reach_existing_scans(gateway: RunningGateway) -> None:
    org, key = await tenant(gateway, "profiles-tenant")
    r = await gateway.operator("POST", "/v1/profiles", {"name": "weekly", "steps": STEPS}, key=key)
    assert r.status == 201, r.body
    profile = r.body
    assert (profile["organization_id"], profile["name"], profile["gateway_execution"], profile["version"]) == (
        org, "weekly", True, 1)
    assert [(s["task_type"], s["lease_seconds"]) for s in profile["steps"]] == [("discover", 300), ("portscan", 60)]
    assert_problem(await gateway.operator("POST", "/v1/profiles", {"name": "weekly", "steps": STEPS}, key=key), 409)

    r = await gateway.operator("POST", "/v1/scans", {"targets": {"targets": ["192.0.2.10"]}, "profile": "weekly"}, key=key)
    assert r.status == 201, r.body
    scan = r.body
    assert (scan["execution_mode"], scan["stored_profile_id"]) == ("gateway", profile["id"])
    assert [s["task_type"] for s in scan["profile"]["steps"]] == ["discover", "portscan"]

    r = await gateway.operator("PUT", f"/v1/profiles/{profile['id']}", {"steps": [{"task_type": "vulnscan"}]},
                               key=key)
    assert r.status == 200 and r.body["version"] == 2 and r.body["steps"][0]["task_type"] == "vulnscan", r.body
    assert (await gateway.operator("GET", f"/v1/scans/{scan['id']}", key=key)).body["profile"] == scan["profile"]
    assert [s["name"] for s in (await gateway.operator("GET", "/v1/profiles", key=key)).body["items"]] == ["weekly"]

    r = await gateway.operator("DELETE", f"/v1/profiles/{profile['id']}", key=key)
    assert r.status == 200 and r.body == {"profile_id": profile["id"], "deleted": True}
    assert_problem(await gateway.operator("GET", f"/v1/profiles/{profile['id']}", key=key), 404)
    assert_problem(await gateway.operator("POST", "/v1/scans", {"profile": "weekly"}, key=key), 404)
    assert (await gateway.operator("GET", f"/v1/scans/{scan['id']}", key=key)).body["profile"] == scan["profile"]


async def test_foreign_and_global_profiles(gateway: RunningGateway) -> None:
    org_a, key_a = await tenant(gateway, "profiles-a")
    org_b, key_b = await tenant(gateway, "profiles-b")
    theirs = (await gateway.operator("POST", "/v1/profiles", {"name": "b-only", "steps": STEPS}, key=key_b)).body
    events = await events_logged(gateway)
    for method, path, body in [("GET", f"/v1/profiles/{theirs['id']}", None),
                               ("PUT", f"/v1/profiles/{theirs['id']}", {"steps": STEPS}),
                               ("PUT", f"/v1/profiles/{theirs['id']}/gateway-execution", {"enabled": False}),
                               ("DELETE", f"/v1/profiles/{theirs['id']}", None),
                               ("POST", "/v1/scans", {"profile": "b-only"}),
                               ("POST", "/v1/profiles", {"organization_id": org_b, "name": "x", "steps": STEPS})]:
        assert_problem(await gateway.operator(method, path, body, key=key_a), 404)
    assert await events_logged(gateway) == events
    assert (await gateway.operator("GET", "/v1/profiles", key=key_a)).body["items"] == []

    assert_problem(await gateway.operator("POST", "/v1/profiles", {"scope": "global", "name": "g", "steps": STEPS},
                                          key=key_a), 403)
    r = await gateway.operator("POST", "/v1/profiles", {"scope": "global", "name": "baseline", "steps": STEPS})
    assert r.status == 201 and r.body["organization_id"] is None, r.body
    shared = r.body
    assert (await gateway.operator("GET", f"/v1/profiles/{shared['id']}", key=key_a)).status == 200
    assert_problem(await gateway.operator("PUT", f"/v1/profiles/{shared['id']}", {"steps": STEPS}, key=key_a), 403)
    assert_problem(await gateway.operator("DELETE", f"/v1/profiles/{shared['id']}", key=key_a), 403)
    r = await gateway.operator("POST", "/v1/scans", {"profile": "baseline"}, key=key_a)
    assert r.status == 201 and r.body["stored_profile_id"] == shared["id"], r.body
    own = (await gateway.operator("POST", "/v1/profiles", {"name": "baseline", "steps": [{"task_type": "x"}]},
                                  key=key_a)).body
    r = await gateway.operator("POST", "/v1/scans", {"profile": "baseline"}, key=key_a)
    assert r.body["stored_profile_id"] == own["id"], r.body  # its own one hides the global one
    listed = (await gateway.operator("GET", "/v1/profiles", key=key_a)).body["items"]
    assert {p["id"] for p in listed} == {shared["id"], own["id"]}
    r = await gateway.operator("POST", "/v1/profiles", {"organization_id": org_a, "name": "by-admin", "steps": STEPS})
    assert r.status == 201 and r.body["organization_id"] == org_a, r.body


BAD_PROFILES: list[tuple[dict[str, Any], int]] = [
    ({"name": "p"}, 422),  # no steps
    ({"name": "p", "steps": []}, 422),
    ({"name": "p", "steps": [{"task_type": "a"}] * 51}, 422),
    ({"name": " p", "steps": STEPS}, 422),
    ({"name": "", "steps": STEPS}, 422),
    ({"name": "p" * 101, "steps": STEPS}, 422),
    ({"name": "p", "steps": [{"task_type": "a", "lease_seconds": 0}]}, 422),
    ({"name": "p", "steps": [{"task_type": "a", "max_attempts": "3"}]}, 422),
    ({"name": "p", "steps": [{"task_type": "a", "unknown": 1}]}, 422),
    ({"name": "p", "steps": STEPS, "gateway_execution": "yes"}, 422),
    ({"name": "p", "steps": STEPS, "scope": "everyone"}, 422),
    ({"name": "p", "steps": STEPS, "scope": "global", "organization_id": "00000000-0000-0000-0000-000000000001"}, 422),
    ({"name": "p", "steps": STEPS, "organization_id": "not-a-uuid"}, 422),
]


async def test_bad_profile_input_changes_nothing(gateway: RunningGateway) -> None:
    org, key = await tenant(gateway, "bad-input")
    events = await events_logged(gateway)
    for body, status in BAD_PROFILES:
        assert_problem(await gateway.operator("POST", "/v1/profiles", body, key=key), status)
    assert_problem(await gateway.operator("POST", "/v1/profiles", {"scope": "global", "name": "p", "steps": STEPS},
                                          key=key), 403)
    assert await events_logged(gateway) == events


async def test_bad_input_on_the_other_routes_changes_nothing(gateway: RunningGateway) -> None:
    org, key = await tenant(gateway, "bad-input-2")
    profile = (await gateway.operator("POST", "/v1/profiles", {"name": "p", "steps": STEPS}, key=key)).body["id"]
    scan = (await gateway.operator("POST", "/v1/scans", {}, key=key)).body["id"]
    events = await events_logged(gateway)
    for method, path, body, status in [
        ("PUT", f"/v1/profiles/{profile}", {"steps": []}, 422),
        ("PUT", f"/v1/profiles/{profile}", {"steps": STEPS, "name": "renamed"}, 422),
        ("PUT", f"/v1/profiles/{profile}/gateway-execution", {"enabled": 1}, 422),
        ("PUT", f"/v1/profiles/{profile}/gateway-execution", {}, 422),
        ("PUT", "/v1/profiles/not-a-uuid", {"steps": STEPS}, 404),
        ("PUT", f"/v1/organizations/{org}/gateway-execution", {"enabled": "false"}, 422),
        ("POST", "/v1/scans", {"profile": "missing"}, 404),
        ("POST", "/v1/scans", {"profile": ""}, 422),
        ("POST", "/v1/scans", {"profile": 7}, 422),
        ("POST", "/v1/scans", {"legacy_scan_id": ""}, 422),
        ("POST", f"/v1/scans/{scan}/legacy-status", {"status": "running"}, 409),  # a Gateway scan
        ("POST", f"/v1/scans/{scan}/legacy-status", {"status": "pending"}, 422),
    ]:
        key_used = key if "organizations" not in path else None
        reply = await (gateway.operator(method, path, body, key=key_used) if key_used
                       else gateway.operator(method, path, body))
        assert_problem(reply, status)
    assert await events_logged(gateway) == events


async def test_flags_over_http_and_a_legacy_scan_no_idle_worker_gets(gateway: RunningGateway) -> None:
    org, key = await tenant(gateway, "legacy-tenant")
    worker = await gateway.worker(task_types=("discover", "portscan", "probe"), org=org)
    assert_problem(await gateway.operator("PUT", f"/v1/organizations/{org}/gateway-execution", {"enabled": False},
                                          key=key), 403)
    r = await gateway.operator("PUT", f"/v1/organizations/{org}/gateway-execution", {"enabled": False})
    assert r.status == 200 and r.body["gateway_execution"] is False, r.body
    assert (await gateway.operator("GET", f"/v1/organizations/{org}", key=key)).body["gateway_execution"] is False

    r = await gateway.operator("POST", "/v1/scans", {"targets": {"targets": ["192.0.2.10"]}, "profile": STEPS}, key=key)
    assert r.status == 201 and r.body["execution_mode"] == "legacy", r.body
    scan = r.body["id"]
    assert await gateway.count("SELECT count(*) FROM scan_jobs WHERE scan_id = %s AND execution_mode = 'legacy'",
                               scan) == 2
    assert (await worker.acquire(wait=1)).status == 204  # idle, capable, polling: nothing for it
    events = await events_logged(gateway)
    assert_problem(await gateway.operator("POST", f"/v1/scans/{scan}/tasks", {"task_type": "probe"}, key=key), 409)
    assert await events_logged(gateway) == events
    assert await gateway.count("SELECT count(*) FROM worker_tasks WHERE scan_id = %s", scan) == 0

    r = await gateway.operator("POST", f"/v1/scans/{scan}/legacy-status", {"status": "running"}, key=key)
    assert r.status == 200 and r.body["status"] == "running", r.body

    # Back on: new scans run on the Gateway again, unless their stored profile says otherwise.
    assert (await gateway.operator("PUT", f"/v1/organizations/{org}/gateway-execution", {"enabled": True})).status == 200
    profile = (await gateway.operator("POST", "/v1/profiles", {"name": "p", "steps": STEPS}, key=key)).body["id"]
    r = await gateway.operator("PUT", f"/v1/profiles/{profile}/gateway-execution", {"enabled": False}, key=key)
    assert r.status == 200 and r.body["gateway_execution"] is False, r.body
    assert (await gateway.operator("POST", "/v1/scans", {"profile": "p"}, key=key)).body["execution_mode"] == "legacy"
    r = await gateway.operator("POST", "/v1/scans", {"profile": STEPS}, key=key)
    assert r.body["execution_mode"] == "gateway", r.body
    lease = (await worker.acquire(wait=1)).body["lease"]
    assert lease["task"]["scan_id"] == r.body["id"]
