"""The console as an operator reads it: headless Chromium signs in, opens the pages, fills the
filters; every check compares what the browser shows with what the database holds."""

from __future__ import annotations

from uuid import UUID

from leasehold.domain.results import payload_sha256
from leasehold.domain.retry import RetryPolicy
from support.browser import (
    PHONE,
    TASK_STATES,
    Console,
    column,
)
from support.gateway import RunningGateway, tenant


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
    task_id = await gateway.task(lease_seconds=2)  # the retry must end inside its lease too
    first, second = await gateway.worker(), await gateway.worker()
    assert (await first.acquire()).body["lease"]["task"]["id"] == str(task_id)
    # The first lease lapses, the task comes back.
    retry = await second.acquire_offered(what="the expired task to be offered again")
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
