"""The operator's whole workflow through ``leasehold`` (the real console script, in an environment
without the server's packages) against a running Gateway — no curl, no SQL: an organisation, its
key, a worker registered from its certificate and assigned, a target policy, a scan with steps
that a worker runs, the task's history, profiles, schedules, fair shares, keys rotated and revoked,
a worker disabled, enabled and revoked. And the same flow's refusals, each a one-line error that
changes nothing."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from test_finding_work_cli import leasehold
from test_operator_api import changes

from leasehold.cli.dev_ca import issue_worker_certificate
from support.gateway import RunningGateway, WorkerClient
from support.slim import without_server_env


@pytest.fixture(scope="module")
def base_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return without_server_env(tmp_path_factory.mktemp("client-only"))


async def ok(gateway: RunningGateway, env: dict[str, str], *args: str, key: str | None = None) -> Any:
    """Run a command with ``--json``; its output's JSON objects (one per line)."""
    code, out, err = await leasehold(gateway, env, *args, "--json", **({"key": key} if key else {}))
    assert code == 0, (args, err)
    items = [orjson.loads(line) for line in out.splitlines()]
    return items[0] if len(items) == 1 else items


async def test_an_operator_runs_a_scan_end_to_end_from_the_command_line(
        gateway: RunningGateway, base_env: dict[str, str], tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    org = await ok(gateway, base_env, "organizations", "create", f"acme-{suffix}")
    assert (await ok(gateway, base_env, "organizations", "show", org["id"]))["name"] == f"acme-{suffix}"
    assert org["id"] in {o["id"] for o in await ok(gateway, base_env, "organizations", "list")}

    code, key, err = await leasehold(gateway, base_env, "keys", "create", "--name", "ops", "--organization", org["id"])
    assert code == 0 and key.strip().startswith("lh_") and "shown once" in err, err
    org_key = key.strip()

    name = f"scanner-{suffix}"
    cert = issue_worker_certificate(gateway.pki.directory, name)
    worker = await ok(gateway, base_env, "workers", "register", "--name", name, "--cert", str(cert.cert_path),
                      "--task-type", "probe", "--task-type", "crawl", "--max-concurrent", "2",
                      "--organization", org["id"])
    assert worker["fingerprint"] == cert.fingerprint and sorted(worker["task_types"]) == ["crawl", "probe"]
    assert [a["organization_id"] for a in worker["assignments"]] == [org["id"]]

    policy = await ok(gateway, base_env, "organizations", "target-policy", org["id"], "--deny", "198.51.100.0/24")
    assert policy["deny"] == ["198.51.100.0/24"]
    code, _, err = await leasehold(gateway, base_env, "scans", "create", "--target", "198.51.100.7",
                                   "--step", "probe", key=org_key)
    assert code == 1 and "198.51.100.7" in err and err.count("\n") == 1, err

    scan = await ok(gateway, base_env, "scans", "create", "--target", "192.0.2.10", "--ports", "80,443-444",
                    "--step", "probe", "--step", "crawl", key=org_key)
    assert scan["targets"] == {"targets": ["192.0.2.10"], "ports": [80, "443-444"]} and scan["organization_id"] == org["id"]

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=gateway.worker_ssl(cert.cert_path,
                                                                                          cert.key_path)))
    gateway.sessions.append(session)
    agent = WorkerClient(name, uuid.UUID(worker["id"]), cert.fingerprint, session, gateway.worker_url)
    lease = (await agent.acquire()).body["lease"]
    assert lease["task"]["task_type"] == "probe" and lease["task"]["scope"]["targets"] == ["192.0.2.10"]
    assert (await agent.write(lease, "progress")).status == 200
    assert (await agent.final_batch(lease)).status == 200
    assert (await agent.write(lease, "complete")).status == 200

    detail = await ok(gateway, base_env, "scans", "show", scan["id"])
    probe, crawl = detail["jobs"]
    assert probe["status"] == "success" and crawl["task"]["state"] == "pending"
    events = await ok(gateway, base_env, "tasks", "events", lease["task"]["id"])
    assert [e["type"] for e in events][:2] == ["TaskCreated", "TaskLeased"] and events[-1]["type"] == "TaskCompleted"
    assert all("lease_token" not in orjson.dumps(e["payload"]).decode() for e in events)

    cancelled = await ok(gateway, base_env, "tasks", "cancel", crawl["task"]["id"], "--reason", "enough")
    assert cancelled["state"] == "cancelled"

    share = await ok(gateway, base_env, "organizations", "fair-share", org["id"], "--weight", "3",
                     "--max-live-attempts", "5")
    assert (share["weight"], share["max_live_attempts"]) == (3, 5)

    profile = await ok(gateway, base_env, "profiles", "create", "weekly", "--step", "probe", key=org_key)
    scan2 = await ok(gateway, base_env, "scans", "create", "--target", "192.0.2.11", "--profile", "weekly",
                     key=org_key)
    assert scan2["stored_profile_id"] == profile["id"]
    assert (await ok(gateway, base_env, "profiles", "delete", profile["id"], key=org_key))["deleted"] is True

    schedule = await ok(gateway, base_env, "schedules", "create", "nightly", "--target", "192.0.2.12",
                        "--step", "probe", "--every", "3600", key=org_key)
    assert (await ok(gateway, base_env, "schedules", "pause", schedule["id"], key=org_key))["enabled"] is False
    assert (await ok(gateway, base_env, "schedules", "resume", schedule["id"], key=org_key))["enabled"] is True
    run = await ok(gateway, base_env, "schedules", "run-now", schedule["id"], key=org_key)
    assert (await ok(gateway, base_env, "scans", "show", run["scan_id"]))["scan"]["targets"] == {
        "targets": ["192.0.2.12"]}
    assert (await ok(gateway, base_env, "schedules", "delete", schedule["id"], key=org_key))["deleted"] is True

    assert (await ok(gateway, base_env, "workers", "disable", worker["id"]))["enabled"] is False
    assert (await agent.acquire()).status == 403
    assert (await ok(gateway, base_env, "workers", "enable", worker["id"]))["enabled"] is True
    updated = await ok(gateway, base_env, "workers", "update", worker["id"], "--max-concurrent", "3")
    assert updated["max_concurrent_tasks"] == 3
    revoked = await ok(gateway, base_env, "workers", "revoke", worker["id"], "--reason", "decommissioned")
    assert revoked["worker"]["revoked_at"] is not None

    keys = await ok(gateway, base_env, "keys", "list", "--organization", org["id"])
    (record,) = [keys] if isinstance(keys, dict) else keys
    code, new_key, err = await leasehold(gateway, base_env, "keys", "rotate", record["id"])
    assert code == 0 and new_key.strip() != org_key, err
    code, _, err = await leasehold(gateway, base_env, "scans", "list", key=org_key)
    assert code == 1 and "401" in err
    assert (await ok(gateway, base_env, "scans", "list", key=new_key.strip()))
    rotated = (await ok(gateway, base_env, "keys", "list", "--organization", org["id"]))
    live = [k for k in rotated if k["revoked_at"] is None]
    assert (await ok(gateway, base_env, "keys", "revoke", live[0]["id"]))["revoked_at"] is not None


async def test_refusals_are_one_line_and_change_nothing(gateway: RunningGateway, base_env: dict[str, str]) -> None:
    before = await changes(gateway)
    for args, wanted in (
            (("scans", "create", "--organization", str(gateway.org), "--targets", '{"hosts": ["192.0.2.10"]}',
              "--step", "probe"), "targets select nothing to scan (they have hosts)"),
            (("scans", "create", "--organization", str(gateway.org), "--steps", '[{"task_type": "probe", "x": 1}]'),
             "422 Unprocessable Content: the request does not match its schema (profile.list[ProfileStepBody].0.x: Extra"),
            (("workers", "assign", str(uuid.uuid4()), str(gateway.org)), "404"),
            (("tasks", "cancel", "not-a-uuid"), "4"),
            (("organizations", "fair-share", str(gateway.org), "--weight", "2"), "--max-live-attempts N or --no-cap")):
        code, out, err = await leasehold(gateway, base_env, *args)
        assert code in (1, 2) and out == "" and wanted in err, (args, err)
        assert err.startswith("leasehold: error: ") and err.count("\n") == 1, err
    code, _, err = await leasehold(gateway, base_env, "workers", "register", "--name", "x", "--cert", "/nonexistent")
    assert code == 2 and "cannot read the certificate" in err
    assert await changes(gateway) == before


async def test_a_bulk_retry_from_the_command_line(gateway: RunningGateway, base_env: dict[str, str]) -> None:
    from support.bulk import failed_tasks

    await gateway.task()  # keeps the scan open
    failed = await failed_tasks(gateway.services, gateway.org, gateway.scan, 5)
    which = ("--organization", str(gateway.org), "--state", "failed_terminal")
    code, out, err = await leasehold(gateway, base_env, "bulk", "retry", *which, "--preview")
    assert (code, out.strip()) == (0, "5 tasks would be retried"), err
    code, out, err = await leasehold(gateway, base_env, "bulk", "retry", *which, "--reason", "fixed", "--wait", "--json")
    assert code == 0, err
    op = orjson.loads(out)
    assert (op["status"], op["total"], op["done"]) == ("finished", 5, 5) and "5/5 reached" in err, (op, err)
    outcomes = await ok(gateway, base_env, "bulk", "tasks", op["id"])
    assert sorted(o["task_id"] for o in outcomes) == sorted(str(t) for t in failed)
    assert [o["id"] for o in [await ok(gateway, base_env, "bulk", "list")]] == [op["id"]]
    code, out, _ = await leasehold(gateway, base_env, "bulk", "show", op["id"])
    assert code == 0 and "finished" in out and "reason: fixed" in out
