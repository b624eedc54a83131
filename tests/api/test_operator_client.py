"""The typed client (:mod:`leasehold.client`) covers the operator's whole surface: every call of
an operator's day, typed answers, one error type — no raw HTTP in this test."""

from __future__ import annotations

import uuid

import aiohttp
import pytest

from leasehold.cli.dev_ca import issue_worker_certificate
from leasehold.client import ApiError, OperatorClient
from support.gateway import ADMIN_KEY, RunningGateway, WorkerClient


def client(gateway: RunningGateway, key: str = ADMIN_KEY) -> OperatorClient:
    return OperatorClient(gateway.operator_url, key, ca_file=str(gateway.pki.ca_cert))


async def test_an_operators_day_through_the_typed_client(gateway: RunningGateway) -> None:
    async with client(gateway) as admin:
        org = await admin.create_organization(f"client-{uuid.uuid4().hex[:8]}")
        assert (await admin.get_organization(org.id)).name == org.name
        assert org.id in {o.id async for o in admin.iter_organizations(page_size=1)}
        created = await admin.create_api_key(org.id, "ops")
        assert (await admin.get_api_key(created.id)).organization_id == org.id

        cert = issue_worker_certificate(gateway.pki.directory, f"typed-{uuid.uuid4().hex[:8]}")
        worker = await admin.register_worker("typed", cert.fingerprint, task_types=["probe"], max_concurrent_tasks=1)
        worker = await admin.assign_worker(worker.id, org.id)
        assert [a.organization_id for a in worker.assignments] == [org.id]
        assert (await admin.update_worker(worker.id, max_concurrent_tasks=2)).max_concurrent_tasks == 2
        policy = await admin.set_target_policy(org.id, deny=["203.0.113.0/24"])
        assert policy.deny == ["203.0.113.0/24"] and (await admin.get_target_policy(org.id)).deny == policy.deny
        share = await admin.set_fair_share(org.id, weight=2, max_live_attempts=None)
        assert share.weight == 2 and (await admin.get_fair_share(org.id)).max_live_attempts is None

    async with client(gateway, created.key) as api:
        with pytest.raises(ApiError) as refused:
            await api.create_scan(targets={"hosts": ["192.0.2.10"]}, profile=[{"task_type": "probe"}])
        assert refused.value.status == 422 and "hosts" in refused.value.detail
        profile = await api.create_profile("daily", [{"task_type": "probe"}])
        assert [p.id for p in (await api.list_profiles()).items if p.name == "daily"] == [profile.id]
        scan = await api.create_scan(targets={"targets": ["192.0.2.10"]}, profile="daily")
        assert scan.stored_profile_id == profile.id
        (job,) = (await api.scan_detail(scan.id)).jobs
        assert job.task is not None

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            ssl=gateway.worker_ssl(cert.cert_path, cert.key_path)))
        gateway.sessions.append(session)
        agent = WorkerClient("typed", worker.id, cert.fingerprint, session, gateway.worker_url)
        lease = (await agent.acquire()).body["lease"]
        assert lease["task"]["id"] == str(job.task.id)
        assert (await agent.write(lease, "fail", error="plugin crashed", retryable=False)).status == 200
        events = await api.task_events(job.task.id, limit=1)
        assert events.items[0].type == "TaskCreated" and events.next_after_version == 1
        rest = await api.task_events(job.task.id, after_version=1)
        assert rest.items[-1].type == "AttemptFailed" and rest.next_after_version is None
        retried = await api.retry_task(job.task.id, reason="fixed the plugin")
        assert retried.state == "pending"

        schedule = await api.create_schedule("hourly", [{"task_type": "probe"}], targets={"targets": ["192.0.2.11"]},
                                             interval_seconds=3600)
        assert (await api.pause_schedule(schedule.id)).enabled is False
        assert (await api.resume_schedule(schedule.id)).enabled is True
        started = await api.run_schedule_now(schedule.id)
        assert (await api.get_scan(started.scan_id)).targets == {"targets": ["192.0.2.11"]}
        assert [s.id for s in (await api.list_schedules()).items] == [schedule.id]
        assert (await api.delete_schedule(schedule.id)).deleted
        assert (await api.replace_profile(profile.id, [{"task_type": "crawl"}])).version == 2
        assert (await api.delete_profile(profile.id)).deleted

    async with client(gateway) as admin:
        assert (await admin.disable_worker(worker.id)).enabled is False
        assert (await admin.enable_worker(worker.id)).enabled is True
        revocation = await admin.unassign_worker(worker.id, org.id, finish_active=True)
        assert revocation.worker.assignments[0].state != "active" and revocation.cancelled_task_ids == []
        assert (await admin.revoke_worker(worker.id, reason="retired")).worker.revoked_at is not None
        rotated = await admin.rotate_api_key(created.id)
        assert rotated.key != created.key and (await admin.get_api_key(created.id)).revoked_at is not None
        assert {k.id async for k in admin.iter_api_keys(organization_id=org.id)} == {created.id, rotated.id}
        assert (await admin.revoke_api_key(rotated.id)).revoked_at is not None


async def test_a_bulk_cancel_through_the_typed_client(gateway: RunningGateway) -> None:
    import asyncio

    tasks = [await gateway.task() for _ in range(8)]
    async with client(gateway) as admin:
        assert (await admin.preview_bulk("cancel", scan_id=gateway.scan, state="pending")).matched == 8
        started = await admin.start_bulk("cancel", reason="wrong targets", scan_id=gateway.scan, state="pending",
                                         idempotency_key="bulk-1")
        again = await admin.start_bulk("cancel", reason="wrong targets", scan_id=gateway.scan, state="pending",
                                       idempotency_key="bulk-1")
        assert again.id == started.id
        seen: list[int] = []
        async with asyncio.timeout(60):
            done = await admin.wait_for_bulk(started.id, interval=0.1, progress=lambda op: seen.append(op.done))
        assert (done.status, done.done) == ("finished", 8) and seen[-1] == 8
        page = await admin.bulk_tasks(started.id, limit=5)
        rest = await admin.bulk_tasks(started.id, after=page.next_after)
        assert sorted(o.task_id for o in [*page.items, *rest.items]) == sorted(tasks)
        assert [op.id for op in (await admin.list_bulk()).items] == [started.id]
        assert (await admin.stop_bulk(started.id)).status == "finished"  # stopping a finished one changes nothing
        with pytest.raises(ApiError) as refused:
            await admin.start_bulk("retry")
        assert refused.value.status == 422
