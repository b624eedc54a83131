"""The console as an operator uses it: headless Chromium signs in, reads the pages, fills the
filters, clicks the buttons; every check compares what the browser shows with what the database
holds (or what the same command through the API records)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

from aiohttp import web

from domain.results import payload_sha256
from domain.retry import RetryPolicy
from support.browser import PHONE, Console
from support.gateway import RunningGateway, WorkerClient, tenant

TASK_STATES = ("pending", "leased", "running", "retry_wait", "completed", "failed_terminal", "cancelling",
               "cancelled")


async def column(gateway: RunningGateway, query: str, *params: Any) -> list[Any]:
    async with gateway.pool.connection() as conn:
        cur = await conn.execute(query, params)
        return [row[0] for row in await cur.fetchall()]


async def state_of(gateway: RunningGateway, task_id: UUID) -> str:
    return str(await gateway.count("SELECT state FROM worker_tasks WHERE id = %s", task_id))


async def task_state_shown(console: Console) -> str:
    (row,) = await console.rows("The task")
    headers = await console.headers("The task")
    return row[headers.index("State")]


@asynccontextmanager
async def heartbeat(worker: WorkerClient, lease: dict[str, Any]) -> AsyncIterator[list[str]]:
    """The worker's side while the test runs: it renews its lease every 100 ms, as an agent does,
    and when a renewal says the task is cancelled it stops and acknowledges. Yields what it did."""
    done: list[str] = []

    async def beat() -> None:
        while True:
            renewed = await worker.write(lease, "renew")
            assert renewed.status == 200, renewed.body
            if renewed.body["cancel_requested"]:
                acked = await worker.write(lease, "cancel-ack")
                assert acked.status == 200, acked.body
                done.append(acked.body["task"]["state"])
                return
            await asyncio.sleep(0.1)

    runner = asyncio.create_task(beat())
    try:
        yield done
    finally:
        if not runner.done():
            runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner


async def test_sign_in_with_a_key_opens_the_overview(console: Console) -> None:
    page = console.page
    # Signed out, the console sends the browser to the sign-in form.
    await console.goto("/console/scans")
    assert page.url == console.url("/console/sign-in")
    await console.shot("sign-in")
    await page.get_by_label("Operator API key").fill("not-a-key")
    await page.get_by_role("button", name="Sign in").click()
    await page.get_by_role("alert").filter(has_text="Unknown").wait_for()
    assert await console.session_cookie() is None

    await console.sign_in()
    assert page.url == console.url("/console")
    assert await page.get_by_role("heading", level=1).inner_text() == "Overview"
    assert await page.get_by_role("navigation", name="Console").is_visible()
    assert "administrator" in await page.locator("header").inner_text()
    assert await console.gateway.count("SELECT count(*) FROM console_sessions") == 1


async def test_overview_counts_equal_the_database(console: Console, gateway: RunningGateway) -> None:
    for _ in range(3):
        await gateway.task()
    cancelled = await gateway.task()
    await gateway.lifecycle.request_cancel(cancelled, actor="test")
    worker = await gateway.worker()
    for outcome in ("complete", "fail"):  # one attempt of each kind in the last hour's chart
        await gateway.task(priority=5)
        ended = (await worker.acquire()).body["lease"]
        if outcome == "complete":
            assert (await worker.final_batch(ended)).status == 200
        reply = await worker.write(ended, outcome, **({"error": "plugin crashed", "retryable": False}
                                                      if outcome == "fail" else {}))
        assert reply.status == 200, reply.body
    leased = (await worker.acquire()).body["lease"]
    assert (await worker.write(leased, "progress")).status == 200  # running
    assert (await worker.acquire()).status == 200  # leased
    other_org, _ = await tenant(gateway, "other")
    other_scan = await gateway.scans.create_scan(UUID(other_org), {"targets": ["example.com"]})
    for _ in range(2):
        await gateway.task(scan=other_scan)

    await console.sign_in()
    headers = await console.headers("Tasks by state")
    shown = {row[0]: row for row in await console.rows("Tasks by state")}
    async with gateway.pool.connection() as conn:
        cur = await conn.execute("SELECT organization_id::text, state::text, count(*) FROM worker_tasks "
                                 "GROUP BY 1, 2")
        in_database: dict[str, dict[str, int]] = {}
        for org, state, count in await cur.fetchall():
            in_database.setdefault(org, dict.fromkeys(TASK_STATES, 0))[state] = count
    assert set(shown) == set(in_database) == {str(gateway.org), other_org}
    for org, counts in in_database.items():
        assert {s: int(shown[org][headers.index(s)]) for s in TASK_STATES} == counts, org
    mine = in_database[str(gateway.org)]
    assert (mine["pending"], mine["leased"], mine["running"], mine["completed"], mine["failed_terminal"],
            mine["cancelled"]) == (1, 1, 1, 1, 1, 1)
    depth = await gateway.count("SELECT count(*) FROM worker_tasks WHERE organization_id = %s "
                                "AND state IN ('pending', 'retry_wait')", gateway.org)
    assert int(shown[str(gateway.org)][headers.index("Queue depth")]) == depth == 1
    chart = console.page.locator("svg#throughput-chart")
    assert await chart.count() == 1, "the overview has no throughput chart"
    assert await chart.get_attribute("role") == "img" and await chart.get_attribute("aria-label")
    await console.shot("overview")

    phone = await console.context.new_page()
    await phone.set_viewport_size(PHONE)
    await phone.goto(console.url("/console"))
    assert len(await console.rows("Tasks by state", phone)) == 2
    # Readable on a phone: the page itself does not scroll sideways (wide tables scroll in place).
    assert await phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    await console.shot("overview-phone", phone)


async def test_filter_scans_by_status_and_organisation(console: Console, gateway: RunningGateway) -> None:
    other_org, _ = await tenant(gateway, "other")
    other_scan = await gateway.scans.create_scan(UUID(other_org), {"targets": ["example.com"]})
    stopped = await gateway.scans.create_scan(gateway.org, {"targets": ["127.0.0.1"]})
    await gateway.scans.cancel_scan(stopped)
    await console.sign_in()
    page = console.page

    await page.get_by_role("link", name="Scans").click()
    await page.wait_for_url(console.url("/console/scans"))
    every = [r[0] for r in await console.rows("Scans")]
    assert every == [str(s) for s in await column(gateway, "SELECT id FROM scans ORDER BY created_at DESC, id DESC")]
    assert set(every) == {str(gateway.scan), str(stopped), str(other_scan)}
    await console.shot("scans")

    await page.get_by_label("Status").select_option("cancelled")
    await page.get_by_role("button", name="Filter").click()
    await page.wait_for_url("**/console/scans?*status=cancelled*")
    shown = await console.rows("Scans")
    assert [r[0] for r in shown] == [str(s) for s in await column(
        gateway, "SELECT id FROM scans WHERE status = 'cancelled'")] == [str(stopped)]

    await page.get_by_label("Status").select_option("")
    await page.get_by_label("Organisation id").fill(other_org)
    await page.get_by_role("button", name="Filter").click()
    await page.wait_for_url(f"**organization_id={other_org}*")
    assert [r[0] for r in await console.rows("Scans")] == [str(other_scan)]

    await page.get_by_label("Organisation id").fill(str(gateway.org))
    await page.get_by_label("Status").select_option("pending")
    await page.get_by_role("button", name="Filter").click()
    await page.wait_for_url(f"**organization_id={gateway.org}*")
    assert [r[0] for r in await console.rows("Scans")] == [str(gateway.scan)]
    # The filter shows what it filters by.
    assert await page.get_by_label("Status").input_value() == "pending"


async def test_an_expired_and_retried_task_shows_both_attempts_on_the_time_axis(
        console: Console, gateway: RunningGateway) -> None:
    gateway.lifecycle.retry_policy = RetryPolicy(base_seconds=0.05, cap_seconds=0.05)  # retried at once
    task_id = await gateway.task(lease_seconds=1)
    first, second = await gateway.worker(), await gateway.worker()
    assert (await first.acquire()).body["lease"]["task"]["id"] == str(task_id)
    deadline = time.monotonic() + 15
    while (retry := await second.acquire()).status != 200:  # the first lease lapses, the task comes back
        assert time.monotonic() < deadline, "the expired task was never offered again"
        await asyncio.sleep(0.05)
    lease = retry.body["lease"]
    assert lease["task"]["id"] == str(task_id)
    # The retry runs to its end at once (its lease is as short), carrying its final batch.
    records = [{"type": "raw", "n": 1}]
    done = await second.write(lease, "complete", final_batch={
        "sequence_number": 1, "idempotency_key": "k1", "payload_sha256": payload_sha256(records), "payload": records})
    assert done.status == 200, done.body
    attempts = await column(gateway, "SELECT attempt_number || ':' || status FROM worker_task_attempts "
                                     "WHERE task_id = %s ORDER BY attempt_number", task_id)
    assert attempts == ["1:expired", "2:succeeded"]

    await console.sign_in()
    await console.goto(f"/console/scans/{gateway.scan}")
    await console.shot("scan")
    await console.page.get_by_role("link", name=str(task_id)).click()
    await console.page.wait_for_url(console.url(f"/console/tasks/{task_id}"))
    axis = console.page.locator("svg#attempts-axis")
    assert await axis.count() == 1, "the task page has no time axis"
    assert await axis.get_attribute("role") == "img" and await axis.get_attribute("aria-label")
    drawn = await axis.locator("g.attempt").evaluate_all(
        "gs => gs.map(g => g.dataset.attempt + ':' + g.dataset.outcome)")
    assert drawn == attempts
    # Each attempt is really drawn (has a size on the page), the expired one as well as its retry.
    for n in (1, 2):
        box = await axis.locator(f'g.attempt[data-attempt="{n}"]').bounding_box()
        assert box is not None and box["width"] > 0, n
    shown = [f"{r[0]}:{r[1]}" for r in await console.rows("Attempts")]
    assert shown == attempts
    await console.shot("task")


async def test_cancel_a_running_task_until_it_is_cancelled(console: Console, gateway: RunningGateway) -> None:
    task_id = await gateway.task()
    worker = await gateway.worker()
    lease = (await worker.acquire()).body["lease"]
    assert (await worker.write(lease, "progress")).status == 200
    await console.sign_in()
    await console.goto(f"/console/tasks/{task_id}")
    assert await task_state_shown(console) == "running"

    async with heartbeat(worker, lease) as acknowledged:
        await console.page.get_by_label("Reason for cancelling").fill("stopped from the console")
        await console.page.get_by_role("button", name="Cancel this task").click()
        await console.page.wait_for_url(console.url(f"/console/tasks/{task_id}"))
        # The worker learns of it on its next renewal and stops; the page shows it, reloaded.
        await console.reload_until(lambda: _shows(console, "cancelled"))
    assert acknowledged == ["cancelled"] and await state_of(gateway, task_id) == "cancelled"
    assert await console.page.get_by_role("button", name="Cancel this task").count() == 0
    events = (await gateway.operator("GET", f"/v1/tasks/{task_id}/events")).body["items"]
    requested = next(e for e in events if e["type"] == "CancelRequested")
    assert requested["actor"].startswith("operator:") and requested["payload"]["reason"] == "stopped from the console"
    assert events[-1]["type"] == "TaskCancelled"


async def _shows(console: Console, state: str) -> bool:
    return await task_state_shown(console) == state


async def test_retry_a_failed_task_from_its_page(console: Console, gateway: RunningGateway) -> None:
    task_id = await gateway.task()
    worker = await gateway.worker()
    lease = (await worker.acquire()).body["lease"]
    assert (await worker.write(lease, "fail", error="plugin crashed", retryable=False)).status == 200
    assert await state_of(gateway, task_id) == "failed_terminal"
    await console.sign_in()
    await console.goto(f"/console/tasks/{task_id}")
    assert await task_state_shown(console) == "failed_terminal"
    retry = console.page.get_by_role("button", name="Retry")
    assert await retry.count() == 1, "a failed task has no Retry button"
    await retry.click()
    await console.page.wait_for_url(console.url(f"/console/tasks/{task_id}"))
    assert await task_state_shown(console) == "pending" and await state_of(gateway, task_id) == "pending"
    assert await console.page.get_by_role("button", name="Retry").count() == 0
    events = (await gateway.operator("GET", f"/v1/tasks/{task_id}/events")).body["items"]
    assert events[-1]["type"] == "TaskRetried" and events[-1]["actor"].startswith("operator:")


async def test_disable_a_worker_after_confirming(console: Console, gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    idle = await gateway.worker()
    task_id = await gateway.task()
    assert (await worker.acquire()).body["lease"]["task"]["id"] == str(task_id)
    await console.sign_in()
    page = console.page

    assert await console.goto("/console/workers") == 200
    rows = page.locator("table#workers tr[data-worker-id]")
    assert set(await rows.evaluate_all("rs => rs.map(r => r.dataset.workerId)")) == {str(worker.id), str(idle.id)}
    row = page.locator(f'table#workers tr[data-worker-id="{worker.id}"]')
    assert await row.locator('td[data-field="standing"]').inner_text() == "active"
    await console.shot("workers")
    await row.locator(f'a[href="/console/workers/{worker.id}"]').first.click()
    await page.wait_for_url(console.url(f"/console/workers/{worker.id}"))
    await console.shot("worker")

    await page.get_by_role("link", name="Disable").or_(page.get_by_role("button", name="Disable")).click()
    await page.wait_for_url(console.url(f"/console/workers/{worker.id}/disable"))
    assert await gateway.count("SELECT enabled FROM workers WHERE id = %s", worker.id) is True  # not yet
    await page.get_by_role("button", name="Confirm").click()
    await page.wait_for_url(console.url(f"/console/workers/{worker.id}"))
    assert await page.locator('[data-field="standing"]').first.inner_text() == "disabled"

    # The API's command: the worker is disabled and refused, its lease ended and its task is retried.
    assert await gateway.count("SELECT enabled FROM workers WHERE id = %s", worker.id) is False
    assert (await worker.acquire()).status == 403
    assert await state_of(gateway, task_id) in ("retry_wait", "pending")
    (last,) = await column(gateway, "SELECT topic || ' ' || (convert_from(state, 'UTF8')::jsonb ->> 'enabled') "
                                    "FROM events WHERE originator_id = %s ORDER BY originator_version DESC LIMIT 1",
                           worker.id)
    assert last == "domain.events:WorkerEnabledChanged false", last
    assert await gateway.count("SELECT enabled FROM workers WHERE id = %s", idle.id) is True
    await console.goto("/console/workers")
    assert await page.locator(f'tr[data-worker-id="{idle.id}"] td[data-field="standing"]').inner_text() == "active"


async def test_sign_out_ends_the_session(console: Console, gateway: RunningGateway) -> None:
    await console.sign_in()
    assert await console.session_cookie() is not None
    await console.page.get_by_role("button", name="Sign out").click()
    await console.page.wait_for_url(console.url("/console/sign-in"))
    assert await console.session_cookie() is None
    assert await gateway.count("SELECT count(*) FROM console_sessions") == 0
    for path in ("/console", f"/console/scans/{gateway.scan}"):
        await console.goto(path)
        assert console.page.url == console.url("/console/sign-in"), path


async def test_an_organisation_key_cannot_open_another_organisations_scan(
        console: Console, gateway: RunningGateway) -> None:
    own_org, key = await tenant(gateway, "tenant")
    own_scan = await gateway.scans.create_scan(UUID(own_org), {"targets": ["example.com"]})
    foreign_task = await gateway.task()
    await console.sign_in(key)
    assert [r[0] for r in await console.rows("Tasks by state")] == [own_org]

    assert await console.goto(f"/console/scans/{own_scan}") == 200
    for path in (f"/console/scans/{gateway.scan}", f"/console/tasks/{foreign_task}"):
        response = await console.page.goto(console.url(path))
        assert response is not None and response.status == 404, path
        assert response.headers["content-type"].startswith("text/html")
        assert str(gateway.scan) not in await console.page.locator("main").inner_text()
        assert await console.page.get_by_role("navigation", name="Console").is_visible()
    # The same answer as for a scan that does not exist.
    assert await console.goto(f"/console/scans/{UUID(int=7)}") == 404
    await console.goto("/console/scans")
    assert [r[0] for r in await console.rows("Scans")] == [str(own_scan)]


async def test_the_session_cookie_is_httponly_secure_and_strict(console: Console, gateway: RunningGateway) -> None:
    await console.sign_in()
    cookie = await console.session_cookie()
    assert cookie is not None
    assert cookie["httpOnly"] is True and cookie["secure"] is True and cookie["sameSite"] == "Strict", cookie
    assert cookie["path"] == "/console" and cookie["expires"] > time.time()
    # HttpOnly as the browser applies it: the page's scripts cannot read it.
    assert "leasehold_console" not in await console.page.evaluate("document.cookie")

    # SameSite=Strict as the browser applies it: from another site, neither a link to the console
    # (a top-level GET, which Lax would allow) nor a form posting to it (even with the right CSRF
    # token) carries the cookie: the link lands on the sign-in form, the post is refused.
    task_id = await gateway.task()
    await console.goto(f"/console/tasks/{task_id}")
    token = await console.page.locator('form[action$="/cancel"] input[name="csrf"]').input_value()
    action = console.url(f"/console/tasks/{task_id}/cancel")
    page_elsewhere = (f'<p><a href="{console.url("/console")}">Your console</a></p>'
                      f'<form method="post" action="{action}"><input type="hidden" name="csrf" value="{token}">'
                      '<button type="submit">Win a prize</button></form>')

    async def elsewhere_page(_: web.Request) -> web.Response:
        return web.Response(content_type="text/html", text=page_elsewhere)

    elsewhere = web.Application()
    elsewhere.router.add_get("/", elsewhere_page)
    runner = web.AppRunner(elsewhere)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        other_site = f"http://127.0.0.1:{runner.addresses[0][1]}/"
        await console.page.goto(other_site)
        await console.page.get_by_role("link", name="Your console").click()
        await console.page.wait_for_url(console.url("/console/sign-in"))
        await console.page.goto(other_site)
        async with console.page.expect_response(action) as posted:
            await console.page.get_by_role("button", name="Win a prize").click()
        assert (await posted.value).status == 403
    finally:
        await runner.cleanup()
    assert await state_of(gateway, task_id) == "pending"
    # Still signed in: typed in, on the console's own site, the cookie goes with the request.
    assert await console.session_cookie() is not None
    await console.goto("/console")
    assert console.page.url == console.url("/console")
    assert await state_of(gateway, task_id) == "pending"


async def test_a_form_post_without_the_csrf_token_is_refused(console: Console, gateway: RunningGateway) -> None:
    task_id = await gateway.task()
    await console.sign_in()
    page = console.page
    action = console.url(f"/console/tasks/{task_id}/cancel")
    csrf = page.locator('form[action$="/cancel"] input[name="csrf"]')
    for tamper in ("e => e.remove()", "e => { e.value = 'forged' }"):
        await console.goto(f"/console/tasks/{task_id}")
        await csrf.evaluate(tamper)
        async with page.expect_response(action) as posted:
            await page.get_by_role("button", name="Cancel this task").click()
        assert (await posted.value).status == 403, tamper
        assert "CSRF" in await page.get_by_role("alert").inner_text()
        assert await state_of(gateway, task_id) == "pending"
    # The same form, untouched, goes through.
    await console.goto(f"/console/tasks/{task_id}")
    await page.get_by_role("button", name="Cancel this task").click()
    await page.wait_for_url(console.url(f"/console/tasks/{task_id}"))
    assert await state_of(gateway, task_id) == "cancelled"


async def test_audit_verifies_a_task_chain_and_sees_a_broken_one(console: Console, gateway: RunningGateway) -> None:
    task_id = await gateway.task()
    await gateway.lifecycle.request_cancel(task_id, actor="test")
    await console.sign_in()
    assert await console.goto("/console/audit") == 200
    await console.shot("audit")
    assert await console.goto(f"/console/audit/verify?task_id={task_id}") == 200
    assert await console.page.locator("p#verify-result").get_attribute("data-ok") == "true"

    async with gateway.pool.connection() as conn:  # an edit behind the log's back
        await conn.execute("ALTER TABLE events DISABLE TRIGGER events_no_update")
        await conn.execute("UPDATE events SET state = convert_to(replace(convert_from(state, 'UTF8'), 'test', "
                           "'tset'), 'UTF8') WHERE originator_id = %s AND originator_version = 2", (task_id,))
        await conn.execute("ALTER TABLE events ENABLE TRIGGER events_no_update")
    await console.goto(f"/console/audit/verify?task_id={task_id}")
    assert await console.page.locator("p#verify-result").get_attribute("data-ok") == "false"


async def test_an_unknown_console_page_is_an_html_404_with_the_navigation(console: Console) -> None:
    await console.sign_in()
    response = await console.page.goto(console.url("/console/no-such-page"))
    assert response is not None and response.status == 404
    assert response.headers["content-type"].startswith("text/html")
    assert await console.page.get_by_role("navigation", name="Console").is_visible()
