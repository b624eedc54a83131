"""Finding work through the operator API and its Python client (``leasehold.client``): lists of
scans and tasks with filters and keyset cursors, scan detail with jobs and tasks, counts and
queues, retry of a failed task (an event; the rebuild still equals the live tables), workers
with last seen and live leases, and what bad query parameters answer.

Each new route's tenant isolation is also in ``test_tenant_isolation`` (every route has a case
there); the tests here add what a list's filters could leak."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest
from test_operator_api import assert_problem, changes, make_tenant

from leasehold.client import ApiError, OperatorClient
from leasehold.gateway.api.operator import encode_cursor
from leasehold.gateway.commands.lifecycle import NO_TASK_TYPES
from leasehold.persistence.chain import verify_chains
from leasehold.persistence.connection import connect
from leasehold.persistence.snapshot import snapshot
from leasehold.persistence.tables import load_tables
from leasehold.projections.compare import diff
from leasehold.replay.fold import fold
from leasehold.worker.client import GatewayClient
from support.agent import register_worker
from support.gateway import ADMIN_KEY, RunningGateway


def client(gateway: RunningGateway, key: str = ADMIN_KEY) -> OperatorClient:
    return OperatorClient(gateway.operator_url, key, ca_file=str(gateway.pki.ca_cert))


@pytest.fixture
async def admin(gateway: RunningGateway) -> AsyncIterator[OperatorClient]:
    async with client(gateway) as api:
        yield api


async def organisation_with_key(admin: OperatorClient) -> tuple[UUID, OperatorClient, str]:
    org = await admin.create_organization(f"org-{uuid4().hex[:8]}")
    key = (await admin.create_api_key(org.id, "k")).key
    return org.id, OperatorClient(admin.base_url, key, ca_file=_ca(admin)), key


def _ca(api: OperatorClient) -> str | None:
    return api.ca_file


# --- lists and cursors --------------------------------------------------------------------------


async def test_scans_and_tasks_list_newest_first_and_every_page_follows_the_cursor(
        gateway: RunningGateway, admin: OperatorClient) -> None:
    org, api, _ = await organisation_with_key(admin)
    async with api:
        scans = [await api.create_scan(targets={"n": i}) for i in range(7)]
        tasks = [await api.create_task(scans[i % 3].id, "probe" if i % 2 else "crawl") for i in range(9)]
        expected_scans = [s.id for s in sorted(scans, key=lambda s: (s.created_at, s.id), reverse=True)]
        expected_tasks = [t.id for t in sorted(tasks, key=lambda t: (t.created_at, t.id), reverse=True)]

        first = await api.list_scans(limit=3)
        assert [s.id for s in first.items] == expected_scans[:3] and first.next_cursor is not None
        # A scan created between two pages does not shift the next page (keyset, not offset).
        await api.create_scan(targets={"late": True})
        second = await api.list_scans(limit=3, cursor=first.next_cursor)
        assert [s.id for s in second.items] == expected_scans[3:6]
        third = await api.list_scans(limit=3, cursor=second.next_cursor)
        assert [s.id for s in third.items] == expected_scans[6:] and third.next_cursor is None

        paged = [t.id async for t in api.iter_tasks(page_size=2)]
        assert paged == expected_tasks  # each task once, newest first, across five pages
        assert [t.id async for t in api.iter_tasks(page_size=500)] == expected_tasks
        assert {t.organization_id async for t in api.iter_tasks()} == {org}


async def test_task_filters_state_type_scan_worker_organisation_and_time(
        gateway: RunningGateway, admin: OperatorClient) -> None:
    org, api, _ = await organisation_with_key(admin)
    async with api:
        scan_a, scan_b = await api.create_scan(), await api.create_scan()
        probes = [await api.create_task(scan_a.id, "probe") for _ in range(3)]
        crawl = await api.create_task(scan_b.id, "crawl")
        worker = await gateway.worker(org=org)
        lease = (await worker.acquire()).body["lease"]
        leased = UUID(lease["task"]["id"])
        assert leased in {t.id for t in probes}

        assert {t.id for t in (await api.list_tasks(state="leased")).items} == {leased}
        assert {t.id for t in (await api.list_tasks(state="pending")).items} == \
            {t.id for t in [*probes, crawl] if t.id != leased}
        assert [t.id for t in (await api.list_tasks(task_type="crawl")).items] == [crawl.id]
        assert {t.id for t in (await api.list_tasks(scan_id=scan_b.id)).items} == {crawl.id}
        by_worker = (await api.list_tasks(worker_id=worker.id)).items
        assert [(t.id, t.worker_id) for t in by_worker] == [(leased, worker.id)]
        assert (await api.list_tasks(worker_id=uuid4())).items == []
        assert (await api.list_tasks(state="pending", task_type="crawl", scan_id=scan_a.id)).items == []

        # Time range: [created_from, created_to), on the tasks' own creation times.
        ordered = sorted([*probes, crawl], key=lambda t: (t.created_at, t.id))
        middle = ordered[1].created_at
        assert {t.id for t in (await api.list_tasks(created_from=middle)).items} == \
            {t.id for t in ordered if t.created_at >= middle}
        assert {t.id for t in (await api.list_tasks(created_to=middle)).items} == \
            {t.id for t in ordered if t.created_at < middle}
        future = datetime.now(UTC) + timedelta(days=1)
        assert (await api.list_scans(created_from=future)).items == []
        assert {s.id for s in (await api.list_scans(status="pending")).items} == {scan_b.id}
        assert {s.id for s in (await api.list_scans(status="running")).items} == {scan_a.id}

    # The administrator sees every organisation, or one when asked.
    elsewhere = await gateway.task()  # in the fixture's own organisation
    assert {t.id async for t in admin.iter_tasks()} == {elsewhere, *(t.id for t in [*probes, crawl])}
    assert {t.id async for t in admin.iter_tasks(organization_id=org)} == {t.id for t in [*probes, crawl]}
    assert {s.organization_id async for s in admin.iter_scans(organization_id=gateway.org)} == {gateway.org}


async def test_scan_detail_shows_its_jobs_in_order_with_their_tasks(admin: OperatorClient,
                                                                   gateway: RunningGateway) -> None:
    scan = await admin.create_scan(organization_id=gateway.org)
    probe = await admin.create_task(scan.id, "probe")
    extra = await admin.create_task(scan.id, "extra", plugin="extra-plugin")
    detail = await admin.scan_detail(scan.id)
    assert detail.scan.id == scan.id and detail.job_count == 2
    assert [(j.position, j.plugin, j.status) for j in detail.jobs] == [(0, "probe", "queued"),
                                                                        (1, "extra-plugin", "queued")]
    tasks = [j.task for j in detail.jobs]
    assert tasks[0] is not None and (tasks[0].id, tasks[0].state) == (probe.id, "pending")
    assert tasks[1] is not None and tasks[1].id == extra.id
    with pytest.raises(ApiError) as missing:
        await admin.scan_detail(uuid4())
    assert (missing.value.status, missing.value.title) == (404, "Not Found")


# --- counts -------------------------------------------------------------------------------------


async def test_counts_by_state_and_the_queue_of_each_organisation(gateway: RunningGateway,
                                                                  admin: OperatorClient) -> None:
    org, api, _ = await organisation_with_key(admin)
    async with api:
        scan = await api.create_scan()
        first = await api.create_task(scan.id, "probe")
        for _ in range(3):
            await api.create_task(scan.id, "probe")
        worker = await gateway.worker(org=org, capacity=1)
        assert (await worker.acquire()).status == 200
        counts = await api.counts()
    (mine,) = counts.organizations
    assert mine.organization_id == org
    assert mine.tasks_by_state == {"pending": 3, "leased": 1, "running": 0, "retry_wait": 0, "completed": 0,
                                   "failed_terminal": 0, "cancelling": 0, "cancelled": 0}
    assert mine.scans_by_status["running"] == 1 and sum(mine.scans_by_status.values()) == 1
    assert (mine.queue.depth, mine.queue.ready) == (3, 3)
    assert mine.queue.oldest_ready_since is not None and mine.queue.oldest_ready_since > first.created_at
    assert mine.queue.oldest_ready_age_seconds is not None
    assert mine.queue.oldest_ready_age_seconds == pytest.approx(
        (counts.measured_at - mine.queue.oldest_ready_since).total_seconds(), abs=0.001)

    everyone = await admin.counts()
    assert {c.organization_id for c in everyone.organizations} >= {org, gateway.org}
    assert (await admin.counts(organization_id=org)).organizations[0].tasks_by_state == mine.tasks_by_state
    # An organisation with nothing yet still gets its (zero) entry.
    empty, api2, _ = await organisation_with_key(admin)
    async with api2:
        (nothing,) = (await api2.counts()).organizations
    assert nothing.organization_id == empty and nothing.queue.depth == 0 and set(nothing.tasks_by_state.values()) == {0}


# --- retry --------------------------------------------------------------------------------------


async def rebuilt_equals_live(gateway: RunningGateway) -> None:
    async with await connect(gateway.settings.database_url) as conn, snapshot(conn):
        rebuilt = await fold(conn)
        assert diff(await load_tables(conn), rebuilt.tables.tables) == []
        assert await verify_chains(conn) == []


async def test_a_failed_terminal_task_is_retried_as_an_event_with_fresh_attempts_and_its_scan_reopens(
        gateway: RunningGateway, admin: OperatorClient) -> None:
    org, api, _ = await organisation_with_key(admin)
    async with api:
        scan = await api.create_scan()
        task = await api.create_task(scan.id, "probe", max_attempts=2)
        worker = await gateway.worker(org=org)
        lease = (await worker.acquire()).body["lease"]
        assert (await worker.write(lease, "fail", error="boom", retryable=False)).status == 200
        failed = await api.get_task(task.id)
        assert (failed.state, failed.attempt_count, failed.max_attempts) == ("failed_terminal", 1, 2)
        assert (await api.get_scan(scan.id)).status == "failed"

        retried = await api.retry_task(task.id, reason="fixed the scanner")
        # Fresh budget: the attempts made plus max_attempts so far (1 + 2).
        assert (retried.state, retried.attempt_count, retried.max_attempts) == ("pending", 1, 3)
        assert retried.finished_at is None and retried.last_error == "boom"
        assert [a.status for a in retried.attempts] == ["failed"]  # history kept
        reopened = await api.get_scan(scan.id)
        assert (reopened.status, reopened.finished_at) == ("running", None)
        assert [t.id for t in (await api.list_tasks(state="pending")).items] == [task.id]
        detail = await api.scan_detail(scan.id)
        assert detail.jobs[0].status == "queued"

        # Only a failed_terminal task can be retried: now it is pending (409, nothing recorded).
        before = await changes(gateway)
        with pytest.raises(ApiError) as refused:
            await api.retry_task(task.id)
        assert refused.value.status == 409 and "failed_terminal" in refused.value.detail
        assert await changes(gateway) == before

        # It runs again: a second attempt, and the scan settles again (success).
        lease = (await worker.acquire()).body["lease"]
        assert lease["task"]["id"] == str(task.id)
        assert (await worker.write(lease, "complete", final_batch={
            "sequence_number": 1, "idempotency_key": "k1", "payload": [],
            "payload_sha256": "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945"})).status == 200
        done = await api.get_task(task.id)
        assert (done.state, [a.attempt_number for a in done.attempts]) == ("completed", [1, 2])
        assert (await api.get_scan(scan.id)).status == "success"

    r = await gateway.operator("GET", f"/v1/tasks/{task.id}/events")
    retried_events = [e for e in r.body["items"] if e["type"] == "TaskRetried"]
    assert [(e["payload"]["reason"], e["payload"]["max_attempts"], e["actor"].startswith("operator:"))
            for e in retried_events] == [("fixed the scanner", 3, True)]
    await rebuilt_equals_live(gateway)


async def test_retry_budget_is_bounded_and_a_cancelled_scan_is_not_retried(
        gateway: RunningGateway, admin: OperatorClient) -> None:
    org, api, _ = await organisation_with_key(admin)
    async with api:
        scan = await api.create_scan()
        task = await api.create_task(scan.id, "probe", max_attempts=1)
        worker = await gateway.worker(org=org)
        lease = (await worker.acquire()).body["lease"]
        assert (await worker.write(lease, "fail", error="x", retryable=True)).status == 200  # budget spent
        with pytest.raises(ApiError) as over:
            await api.retry_task(task.id, attempts=100)  # 1 made + 100 > 100
        assert over.value.status == 409
        with pytest.raises(ApiError) as invalid:
            await api.retry_task(task.id, attempts=0)
        assert invalid.value.status == 422
        assert (await api.retry_task(task.id, attempts=5)).max_attempts == 6

        other_scan = await api.create_scan()
        other = await api.create_task(other_scan.id, "probe", max_attempts=1)
        second = await api.create_task(other_scan.id, "probe")
        lease = (await worker.acquire()).body["lease"]
        while lease["task"]["id"] != str(other.id):  # lease until we hold `other`
            lease = (await worker.acquire()).body["lease"]
        assert (await worker.write(lease, "fail", error="x", retryable=False)).status == 200
        await api.cancel_scan(other_scan.id)
        assert (await api.get_task(second.id)).state == "cancelled"
        before = await changes(gateway)
        with pytest.raises(ApiError) as cancelled:
            await api.retry_task(other.id)
        assert cancelled.value.status == 409 and "cancelled" in cancelled.value.detail
        assert await changes(gateway) == before
    await rebuilt_equals_live(gateway)


# --- workers ------------------------------------------------------------------------------------


async def test_workers_show_when_they_were_last_seen_and_their_live_leases(gateway: RunningGateway,
                                                                           admin: OperatorClient) -> None:
    a, b = await make_tenant(gateway), await make_tenant(gateway)
    shared = await gateway.worker(org=a.org)
    await gateway.registry.assign_worker(shared.id, b.org)
    idle = await admin.get_worker(shared.id)
    assert idle.last_seen_at is None and idle.live_leases == []

    org_of = {}
    for tenant in (a, b):
        r = await gateway.operator("POST", f"/v1/scans/{tenant.scan}/tasks", {"task_type": "probe"}, key=tenant.key)
        assert r.status == 201
        org_of[r.body["id"]] = tenant.org
    leases = [(await shared.acquire()).body["lease"] for _ in range(2)]
    by_org = {org_of[lease["task"]["id"]]: lease for lease in leases}
    assert set(by_org) == {a.org, b.org}
    renewed = await shared.write(by_org[b.org], "renew")
    assert renewed.status == 200

    seen = await admin.get_worker(shared.id)
    assert {lease.task_id for lease in seen.live_leases} == {UUID(lease["task"]["id"]) for lease in leases}
    assert all(lease.status == "leased" for lease in seen.live_leases)
    last_renewal = await gateway.count(
        "SELECT max(recorded_at) FROM events WHERE topic = 'domain.events:LeaseRenewed' AND originator_id = %s",
        UUID(by_org[b.org]["task"]["id"]))
    assert seen.last_seen_at is not None and abs((seen.last_seen_at - last_renewal).total_seconds()) < 1

    # An organisation key sees only the worker's work on its own tasks.
    async with client(gateway, a.key) as api_a:
        as_a = await api_a.get_worker(shared.id)
        listed = {w.id: w async for w in api_a.iter_workers()}
    assert [lease.organization_id for lease in as_a.live_leases] == [a.org]
    assert as_a.last_seen_at is not None and seen.last_seen_at is not None
    assert as_a.last_seen_at < seen.last_seen_at  # b's renewal came later and is not a's to see
    assert listed[shared.id].live_leases == as_a.live_leases
    await rebuilt_equals_live(gateway)


async def test_a_worker_registered_without_task_types_is_warned_about(gateway: RunningGateway, admin: OperatorClient,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="leasehold.gateway"):
        worker = await admin.register_worker("idle", "ab" * 32)
    assert worker.task_types == [] and len(worker.warnings) == 1 and "task types" in worker.warnings[0]
    assert any("without task types" in r.getMessage() for r in caplog.records)
    assert (await admin.get_worker(worker.id)).warnings == worker.warnings  # on every read, until fixed
    busy = await admin.register_worker("busy", "cd" * 32, task_types=["probe"])
    assert busy.warnings == []


async def test_a_worker_without_task_types_is_told_and_logs_it_once_until_it_changes(
        gateway: RunningGateway, caplog: pytest.LogCaptureFixture) -> None:
    await gateway.task()  # work is waiting, but not for this worker
    worker = await register_worker(gateway, ())
    reply = await worker.client.acquire()
    assert reply.status == 204 and reply.headers["Leasehold-Warning"] == NO_TASK_TYPES
    async with GatewayClient(worker.settings(gateway)) as agent_client:
        with caplog.at_level(logging.WARNING, logger="leasehold.worker"):
            for n in range(3):
                answer = await agent_client.acquire(f"r{n}", wait_seconds=0)
                assert answer.lease is None
        said = [r for r in caplog.records if r.getMessage() == "the Gateway says this worker can get no work"]
        assert [r.__dict__["warning"] for r in said] == [NO_TASK_TYPES]  # once, not on every poll
        await gateway.registry.update_worker(worker.client.id, task_types=("probe",))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="leasehold.worker"):
            answer = await agent_client.acquire("r9", wait_seconds=0)
        assert answer.lease is not None and not caplog.records
    assert "Leasehold-Warning" not in (await worker.client.acquire()).headers


# --- bad query parameters -----------------------------------------------------------------------

BAD_QUERIES = [
    ("/v1/tasks?cursor=bm90LWEtY3Vyc29y", 400),  # base64 of "not-a-cursor"
    ("/v1/scans?cursor=%21%21", 422),  # not even base64url
    ("/v1/tasks?limit=501", 422),
    ("/v1/scans?limit=0", 422),
    ("/v1/tasks?state=sleeping", 422),
    ("/v1/scans?status=done", 422),
    ("/v1/tasks?created_from=yesterday", 422),
    ("/v1/tasks?created_from=2026-01-01T00:00:00", 422),  # no offset
    ("/v1/tasks?created_to=1700000000", 422),  # seconds since 1970 are not RFC 3339
    ("/v1/tasks?worker_id=42", 422),
    ("/v1/tasks?colour=blue", 422),
    ("/v1/counts?organization_id=nope", 422),
]


@pytest.mark.parametrize(("path", "status"), BAD_QUERIES, ids=[p for p, _ in BAD_QUERIES])
async def test_bad_query_parameters_answer_4xx_problems(gateway: RunningGateway, path: str, status: int) -> None:
    assert_problem(await gateway.operator("GET", path), status)


async def test_the_client_raises_one_error_type_with_the_problem(admin: OperatorClient) -> None:
    with pytest.raises(ApiError) as bad:
        await admin.list_tasks(cursor="bm90LWEtY3Vyc29y")
    assert (bad.value.status, bad.value.title) == (400, "Bad Request") and "cursor" in bad.value.detail
    with pytest.raises(ApiError) as invalid:
        await admin.list_tasks(limit=10_000)
    assert invalid.value.status == 422 and invalid.value.body["errors"]
    async with OperatorClient(admin.base_url, "wrong-key", ca_file=_ca(admin)) as intruder:
        with pytest.raises(ApiError) as denied:
            await intruder.counts()
    assert denied.value.status == 401


# --- tenant isolation of the filters ------------------------------------------------------------


async def test_an_organisation_key_lists_only_its_own_and_a_foreign_filter_is_an_unknown_one(
        gateway: RunningGateway) -> None:
    a, b = await make_tenant(gateway), await make_tenant(gateway)
    for caller, victim in ((a, b), (b, a)):
        for path in ("/v1/scans", "/v1/tasks", "/v1/counts"):
            foreign = await gateway.operator("GET", f"{path}?organization_id={victim.org}", key=caller.key)
            unknown = await gateway.operator("GET", f"{path}?organization_id={uuid4()}", key=caller.key)
            assert_problem(foreign, 404)
            assert (foreign.status, foreign.body["detail"]) == (unknown.status, unknown.body["detail"])
        # Filters naming the victim's scan or worker find nothing (never the victim's tasks).
        for query in (f"scan_id={victim.scan}", f"worker_id={victim.worker_id}"):
            r = await gateway.operator("GET", f"/v1/tasks?{query}", key=caller.key)
            assert r.status == 200 and r.body["items"] == []
        own = await gateway.operator("GET", "/v1/tasks", key=caller.key)
        assert [t["id"] for t in own.body["items"]] == [str(caller.task)]
        # A cursor made from the victim's task reveals nothing either: it is only a position.
        victim_task = (await gateway.operator("GET", f"/v1/tasks/{victim.task}")).body
        cursor = encode_cursor(datetime.fromisoformat(victim_task["created_at"]) + timedelta(days=1),
                               UUID(victim_task["id"]))
        r = await gateway.operator("GET", f"/v1/tasks?cursor={cursor}", key=caller.key)
        assert [t["id"] for t in r.body["items"]] == [str(caller.task)]


async def test_the_client_creates_assigns_and_cancels(gateway: RunningGateway, admin: OperatorClient) -> None:
    org = await admin.create_organization(f"org-{uuid4().hex[:8]}")
    assert org.id in {o.id for o in (await admin.list_organizations(limit=500)).items}
    worker = await admin.register_worker("w", "ef" * 32, task_types=["probe"], max_concurrent_tasks=2)
    assigned = await admin.assign_worker(worker.id, org.id)
    assert [(a.organization_id, a.state) for a in assigned.assignments] == [(org.id, "active")]
    scan = await admin.create_scan(organization_id=org.id, targets={"hosts": ["h"]})
    task = await admin.create_task(scan.id, "probe", priority=5, parameters={"n": 1})
    assert (task.priority, task.parameters, task.state) == (5, {"n": 1}, "pending")
    cancelled = await admin.cancel_task(task.id, reason="not needed")
    assert cancelled.state == "cancelled"
    assert (await admin.get_scan(scan.id)).status == "cancelled"
    raw = await admin.request("GET", f"/v1/tasks/{task.id}/events")
    assert [e["type"] for e in raw["items"]] == ["TaskCreated", "TaskCancelled"]


async def test_a_retried_profile_step_that_succeeds_goes_on_to_the_next_step(gateway: RunningGateway,
                                                                            admin: OperatorClient) -> None:
    worker = await gateway.worker(task_types=("probe", "crawl"))
    scan = await admin.create_scan(organization_id=gateway.org, profile=[
        {"task_type": "probe", "max_attempts": 1}, {"task_type": "crawl"}])
    lease = (await worker.acquire()).body["lease"]
    assert (await worker.write(lease, "fail", error="x", retryable=False)).status == 200
    assert (await admin.get_scan(scan.id)).status == "failed"
    assert (await admin.scan_detail(scan.id)).job_count == 1  # stop_on_failure: nothing more
    await admin.retry_task(lease["task"]["id"])
    lease = (await worker.acquire()).body["lease"]
    assert (await worker.final_batch(lease)).status == 200
    assert (await worker.write(lease, "complete")).status == 200
    detail = await admin.scan_detail(scan.id)
    assert [(j.plugin, j.status) for j in detail.jobs] == [("probe", "success"), ("crawl", "queued")]
    assert detail.scan.status == "running" and detail.jobs[1].task is not None
