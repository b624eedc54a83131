"""The operator console over HTTP, on a real Gateway: sign-in and session cookie, the pages
reading what the database holds, the cancel form, CSRF, organisation isolation, sign-out, and
the console's absence from the worker port."""

from __future__ import annotations

import hashlib
import re
from uuid import UUID

from leasehold.domain.retry import RetryPolicy
from support.console import Browser, signed_in, state_of, wait_for_state
from support.gateway import ADMIN_KEY, RunningGateway, tenant


async def test_sign_in_sets_a_locked_down_session_cookie(gateway: RunningGateway) -> None:
    browser = Browser(gateway)
    # Not signed in: every page leads to the sign-in form.
    assert (await browser.get("/console")).headers["Location"] == "/console/sign-in"
    form = await browser.get("/console/sign-in")
    assert '<label for="key">' in form.text and "<main>" in form.text
    refused = await browser.post("/console/sign-in", {"csrf": form.csrf, "key": "not-a-key"})
    assert refused.status == 401 and "Unknown" in refused.text
    assert await gateway.count("SELECT count(*) FROM console_sessions") == 0

    reply = await browser.sign_in()
    assert reply.status == 303
    cookie = next(v for v in reply.headers.getall("Set-Cookie") if v.startswith("leasehold_console="))
    flags = {part.strip().split("=")[0].lower(): part.strip() for part in cookie.split(";")[1:]}
    assert {"httponly", "secure", "samesite", "max-age", "path"} <= set(flags), cookie
    assert flags["samesite"] == "SameSite=Strict" and flags["path"] == "Path=/console"
    assert int(flags["max-age"].split("=")[1]) > 0
    # Only the token's hash is stored, and it expires.
    token = browser.cookie()
    stored, live = await gateway.count(
        "SELECT array[encode(token_hash, 'hex'), (expires_at > now())::text] FROM console_sessions")
    assert stored == hashlib.sha256(token.encode()).hexdigest() and live == "true"
    overview = await browser.get("/console")
    assert overview.status == 200 and "<nav" in overview.text and "<header>" in overview.text


async def test_overview_counts_match_the_database(gateway: RunningGateway) -> None:
    for _ in range(3):
        await gateway.task()
    cancelled = await gateway.task()
    await gateway.lifecycle.request_cancel(cancelled, actor="test")
    worker = await gateway.worker()
    assert (await worker.acquire()).status == 200
    browser = await signed_in(gateway)
    page = await browser.get("/console")
    header = ["pending", "leased", "running", "retry_wait", "completed", "failed_terminal", "cancelling",
              "cancelled"]
    (row,) = [r for r in page.rows("Tasks by state") if r[0] == str(gateway.org)]
    shown = dict(zip(header, map(int, row[1:9]), strict=True))
    async with gateway.pool.connection() as conn:
        cur = await conn.execute("SELECT state, count(*) FROM worker_tasks WHERE organization_id = %s GROUP BY state",
                                 (gateway.org,))
        in_database = dict(await cur.fetchall())
    assert shown == {s: in_database.get(s, 0) for s in header}
    assert shown["pending"] == 2 and shown["leased"] == 1 and shown["cancelled"] == 1
    api = (await gateway.operator("GET", "/v1/counts")).body["organizations"]
    (queue,) = [o["queue"] for o in api if o["organization_id"] == str(gateway.org)]
    assert int(row[9]) == queue["depth"] == 2 and int(row[10]) == queue["ready"]
    assert row[11].endswith(("s", "min"))  # the oldest pending task's age


async def test_scans_filter_by_status_and_organisation(gateway: RunningGateway) -> None:
    other_org, _ = await tenant(gateway, "other")
    other_scan = str(await gateway.scans.create_scan(UUID(other_org), {"targets": ["example.com"]}))
    done = await gateway.scans.create_scan(gateway.org, {"targets": ["127.0.0.1"]})
    await gateway.scans.cancel_scan(done)
    browser = await signed_in(gateway)

    every = {r[0] for r in (await browser.get("/console/scans")).rows("Scans")}
    assert every == {str(gateway.scan), str(done), other_scan}
    cancelled = (await browser.get("/console/scans?status=cancelled")).rows("Scans")
    assert [r[0] for r in cancelled] == [str(done)] and cancelled[0][2] == "cancelled"
    of_other = (await browser.get(f"/console/scans?organization_id={other_org}")).rows("Scans")
    assert [r[0] for r in of_other] == [other_scan]
    both = (await browser.get(f"/console/scans?organization_id={gateway.org}&status=pending")).rows("Scans")
    assert [r[0] for r in both] == [str(gateway.scan)]
    bad = await browser.get("/console/scans?status=nonsense")
    assert bad.status == 400 and "not valid" in bad.text


async def test_scan_and_task_pages_show_jobs_attempts_and_timeline(gateway: RunningGateway) -> None:
    gateway.lifecycle.retry_policy = RetryPolicy(base_seconds=0.05, cap_seconds=0.05)  # retried at once
    task_id = await gateway.task(lease_seconds=1)
    worker = await gateway.worker()
    lease = await worker.acquire()
    assert lease.status == 200 and lease.body["lease"]["task"]["id"] == str(task_id)
    await wait_for_state(gateway, task_id, ("retry_wait", "pending"))  # the first lease expired
    second = await worker.acquire_offered(what="the retry once its backoff is over")
    assert second.body["lease"]["task"]["id"] == str(task_id)
    browser = await signed_in(gateway)

    scan = await browser.get(f"/console/scans/{gateway.scan}")
    jobs = scan.rows("Jobs in order")
    assert [r[3] for r in jobs] == [str(task_id)] and jobs[0][4] == "leased" and jobs[0][5] == "2"

    page = await browser.get(f"/console/tasks/{task_id}")
    assert page.status == 200
    attempts = page.rows("Attempts")
    async with gateway.pool.connection() as conn:
        cur = await conn.execute("SELECT attempt_number, status FROM worker_task_attempts WHERE task_id = %s "
                                 "ORDER BY attempt_number", (task_id,))
        in_database = [(str(n), status) for n, status in await cur.fetchall()]
    assert [(a[0], a[1]) for a in attempts] == in_database and len(in_database) == 2
    assert in_database[0][1] == "expired" and {a[2] for a in attempts} == {str(worker.id)}
    timeline = re.findall(r"<li>(.*?)</li>", page.text.split('id="timeline"')[1])
    events = (await gateway.operator("GET", f"/v1/tasks/{task_id}/events")).body["items"]
    assert len(timeline) == len(events) >= 4
    assert timeline[0].startswith("Task created by") and timeline[1].startswith("Task leased by worker:")
    assert any(s.startswith("Lease expired by") for s in timeline)
    assert sum(s.startswith("Task leased by") for s in timeline) == 2


async def test_cancel_form_cancels_with_the_token_and_refuses_without(gateway: RunningGateway) -> None:
    waiting = await gateway.task(priority=1)
    running = await gateway.task()  # created now: a scan whose tasks all ended takes no more
    browser = await signed_in(gateway)
    page = await browser.get(f"/console/tasks/{waiting}")
    assert "Cancel this task" in page.text and '<label for="reason">' in page.text

    for form in ({}, {"csrf": "forged"}, {"csrf": page.csrf + "x"}):
        refused = await browser.post(f"/console/tasks/{waiting}/cancel", {"reason": "x", **form})
        assert refused.status == 403, form
    assert await state_of(gateway, waiting) == "pending"

    reason = "<script>alert('not needed')</script>"
    done = await browser.post(f"/console/tasks/{waiting}/cancel", {"csrf": page.csrf, "reason": reason})
    assert done.status == 303 and done.headers["Location"] == f"/console/tasks/{waiting}"
    assert await state_of(gateway, waiting) == "cancelled"
    after = await browser.get(f"/console/tasks/{waiting}")
    assert "Cancel this task" not in after.text
    assert "&lt;script&gt;alert(&#x27;not needed&#x27;)&lt;/script&gt;" in after.text and "<script" not in after.text

    worker = await gateway.worker()
    assert (await worker.acquire()).status == 200
    page = await browser.get(f"/console/tasks/{running}")
    await browser.post(f"/console/tasks/{running}/cancel", {"csrf": page.csrf})
    assert await state_of(gateway, running) == "cancelling"  # the worker is told to stop
    events = (await gateway.operator("GET", f"/v1/tasks/{running}/events")).body["items"]
    assert events[-1]["type"] == "CancelRequested" and events[-1]["actor"].startswith("operator:")

    # The sign-in form has its own token too.
    fresh = Browser(gateway)
    assert (await fresh.post("/console/sign-in", {"key": ADMIN_KEY})).status == 403
    assert await gateway.count("SELECT count(*) FROM console_sessions") == 1


async def test_an_organisation_key_sees_only_its_organisation(gateway: RunningGateway) -> None:
    other_org, key = await tenant(gateway, "tenant")
    foreign_task = await gateway.task()
    own_scan = str(await gateway.scans.create_scan(UUID(other_org), {"targets": ["example.com"]}))
    browser = await signed_in(gateway, key)

    overview = await browser.get("/console")
    assert [r[0] for r in overview.rows("Tasks by state")] == [other_org]
    assert [r[0] for r in (await browser.get("/console/scans")).rows("Scans")] == [own_scan]
    assert (await browser.get(f"/console/scans/{own_scan}")).status == 200
    for path in (f"/console/scans/{gateway.scan}", f"/console/tasks/{foreign_task}",
                 f"/console/scans?organization_id={gateway.org}", "/console/tasks/not-a-uuid"):
        assert (await browser.get(path)).status == 404, path
    # Same answer as an id that does not exist.
    assert (await browser.get(f"/console/tasks/{UUID(int=7)}")).status == 404
    csrf = overview.csrf
    assert (await browser.post(f"/console/tasks/{foreign_task}/cancel", {"csrf": csrf})).status == 404
    assert await state_of(gateway, foreign_task) == "pending"


async def test_sign_out_and_revocation_end_the_session(gateway: RunningGateway) -> None:
    browser = await signed_in(gateway)
    token = browser.cookie()
    page = await browser.get("/console")
    assert (await browser.post("/console/sign-out", {})).status == 403  # a form like any other
    out = await browser.post("/console/sign-out", {"csrf": page.csrf})
    assert out.status == 303 and out.headers["Location"] == "/console/sign-in"
    assert await gateway.count("SELECT count(*) FROM console_sessions") == 0
    # The old cookie, sent again, signs nobody in.
    browser.session.cookie_jar.update_cookies({"leasehold_console": token})
    assert (await browser.get("/console")).status == 303
    assert (await browser.post("/console/sign-out", {"csrf": page.csrf})).status == 403

    # Revoking the key ends its sessions at once.
    _, key = await tenant(gateway, "revoked")
    keys = (await gateway.operator("GET", "/v1/api-keys")).body["items"]
    browser = await signed_in(gateway, key)
    assert (await browser.get("/console")).status == 200
    key_id = next(k["id"] for k in keys if k["organization_id"] is not None)
    assert (await gateway.operator("POST", f"/v1/api-keys/{key_id}/revoke")).status == 200
    assert (await browser.get("/console")).status == 303


async def test_an_expired_session_signs_nobody_in(gateway: RunningGateway) -> None:
    browser = await signed_in(gateway)
    assert (await browser.get("/console")).status == 200
    async with gateway.pool.connection() as conn:
        await conn.execute("UPDATE console_sessions SET expires_at = now() - interval '1 second'")
    assert (await browser.get("/console")).headers["Location"] == "/console/sign-in"
    # The next sign-in clears expired sessions.
    await signed_in(gateway)
    assert await gateway.count("SELECT count(*) FROM console_sessions WHERE expires_at <= now()") == 0
    assert await gateway.count("SELECT count(*) FROM console_sessions") == 1


async def test_scans_pages_follow_the_cursor(gateway: RunningGateway) -> None:
    for _ in range(50):  # 51 scans with the fixture's: two pages
        await gateway.scans.create_scan(gateway.org, {"targets": ["127.0.0.1"]})
    browser = await signed_in(gateway)
    first = await browser.get(f"/console/scans?organization_id={gateway.org}")
    link = re.search(r'href="(/console/scans\?[^"]+)">Next page', first.text)
    assert link is not None and len(first.rows("Scans")) == 50
    second = await browser.get(link.group(1).replace("&amp;", "&"))
    seen = {r[0] for r in first.rows("Scans")} | {r[0] for r in second.rows("Scans")}
    assert len(second.rows("Scans")) == 1 and len(seen) == 51 and "Next page" not in second.text


async def test_console_is_not_served_on_the_worker_port(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    on_worker = Browser(gateway, gateway.worker_url, worker.session)
    for path in ("/console", "/console/sign-in", f"/console/tasks/{UUID(int=1)}", "/console/scans"):
        assert (await on_worker.get(path)).status == 404, path
    assert (await on_worker.post("/console/sign-in", {"key": ADMIN_KEY})).status == 404
    assert (await Browser(gateway).get("/console/sign-in")).status == 200
