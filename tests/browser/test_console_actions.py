"""The console as an operator acts on it: headless Chromium cancels, retries, disables, signs out;
and the session cookie and the CSRF tokens as the browser applies them. Every check compares
what the browser shows with what the database holds, or what the same API command records."""

from __future__ import annotations

import time

from aiohttp import web

from support.browser import (
    Console,
    column,
    heartbeat,
    shows_state,
    state_of,
    task_state_shown,
)
from support.gateway import RunningGateway


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
        await console.reload_until(lambda: shows_state(console, "cancelled"))
    assert acknowledged == ["cancelled"] and await state_of(gateway, task_id) == "cancelled"
    assert await console.page.get_by_role("button", name="Cancel this task").count() == 0
    events = (await gateway.operator("GET", f"/v1/tasks/{task_id}/events")).body["items"]
    requested = next(e for e in events if e["type"] == "CancelRequested")
    assert requested["actor"].startswith("operator:") and requested["payload"]["reason"] == "stopped from the console"
    assert events[-1]["type"] == "TaskCancelled"


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
    liveness = (await gateway.operator("GET", f"/v1/workers/{worker.id}")).body["liveness"]
    assert await row.locator('td[data-field="liveness"]').inner_text() == liveness
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
