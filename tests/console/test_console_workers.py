"""The console's worker pages over HTTP, on a real Gateway: the list and the detail read what the
API reads, each action goes through a confirmation page and a CSRF-checked POST, and records the
same events as the API's route; another organisation's worker is a 404, an organisation key's
action a 403; any other path under /console is an HTML 404."""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

import orjson
import pytest

from leasehold.gateway.console import workers as console_workers
from support.console import Browser, Page, signed_in
from support.gateway import RunningGateway, WorkerClient, tenant

TIME = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+(\+00:00|Z)$")
UUIDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def standing(page: Page, worker_id: UUID) -> str:
    found = re.search(rf'<tr data-worker-id="{worker_id}">.*?<td data-field="standing">([a-z]+)</td>', page.text)
    assert found is not None, page.text
    return found.group(1)


async def log_position(gw: RunningGateway) -> int:
    return int(await gw.count("SELECT coalesce(max(notification_id), 0) FROM events"))


async def events_after(gw: RunningGateway, position: int, *ids: UUID) -> list[tuple[str, dict[str, Any]]]:
    """The events appended after ``position``: their topic and payload, with the given ids named by
    their place in ``ids``, other ids and times blanked: what two equivalent commands share."""
    async with gw.pool.connection() as conn:
        cur = await conn.execute("SELECT topic, state FROM events WHERE notification_id > %s ORDER BY notification_id",
                                 (position,))
        rows = await cur.fetchall()
    names = {str(i): f"<{n}>" for n, i in enumerate(ids)}

    def same(value: Any) -> Any:
        if isinstance(value, str) and TIME.match(value):
            return "<time>"
        if isinstance(value, str):
            return UUIDS.sub(lambda m: names.get(m.group(0), "<id>"), value)
        if isinstance(value, dict):
            return {k: same(v) for k, v in value.items() if k not in ("timestamp", "originator_version")}
        if isinstance(value, list):
            return [same(v) for v in value]
        return value
    return [(topic, same(orjson.loads(bytes(state)))) for topic, state in rows]


async def confirm(browser: Browser, path: str, **fields: str) -> Page:
    """Open the confirmation page at ``path``, then post its form with its token."""
    form = await browser.get(path)
    assert form.status == 200, form.text
    assert '<form method="post"' in form.text and '<button type="submit">Confirm</button>' in form.text
    action = re.search(r'<form method="post" action="([^"]+)"', form.text.split("<main>")[1])
    assert action is not None
    return await browser.post(action.group(1).replace("&amp;", "&"), {"csrf": form.csrf, **fields})


async def test_the_list_and_the_detail_show_standing_leases_and_assignments(gateway: RunningGateway) -> None:
    task_id = await gateway.task()
    busy = await gateway.worker()
    idle = await gateway.worker()
    assert (await busy.acquire()).status == 200
    await gateway.registry.set_worker_enabled(idle.id, False)
    browser = await signed_in(gateway)

    listing = await browser.get("/console/workers")
    assert listing.status == 200 and '<table id="workers">' in listing.text
    assert set(re.findall(r'<tr data-worker-id="([^"]+)"', listing.text)) == {str(busy.id), str(idle.id)}
    assert standing(listing, busy.id) == "active" and standing(listing, idle.id) == "disabled"
    (row,) = [r for r in listing.rows("Workers") if r[0] == busy.name]
    assert row[1] == str(gateway.org) and row[6] == "1" and row[7] == "1 (1 active)"
    api = (await gateway.operator("GET", f"/v1/workers/{busy.id}")).body
    assert row[5].startswith(api["last_seen_at"][:19].replace("T", " "))
    assert row[3] == api["liveness"] and row[3] in ("live", "idle", "gone")
    assert f'href="/console/workers/{busy.id}"' in listing.text

    detail = await browser.get(f"/console/workers/{busy.id}")
    assert detail.status == 200 and standing(detail, busy.id) == "active"
    (lease,) = detail.rows("Live leases")
    assert lease[0] == str(task_id) and lease[2] == "leased"
    (assignment,) = detail.rows("Assignments")
    assert assignment[0] == str(gateway.org) and assignment[1] == "active" and assignment[4] == "Unassign"
    for action in ("disable", "revoke", f"unassign?organization_id={gateway.org}"):
        assert f'href="/console/workers/{busy.id}/{action}"' in detail.text, action


async def test_disable_revoke_and_unassign_record_what_the_api_records(gateway: RunningGateway) -> None:
    browser = await signed_in(gateway)
    key_id = UUID((await gateway.operator("GET", "/v1/api-keys")).body["items"][0]["id"])

    async def twins() -> tuple[WorkerClient, WorkerClient]:
        return await gateway.worker(), await gateway.worker()

    # Disable, each with a live lease: the attempt ends at once and the task is free again.
    by_console, by_api = await twins()
    for worker in (by_console, by_api):
        await gateway.task()
        assert (await worker.acquire()).status == 200
    before = await log_position(gateway)
    done = await confirm(browser, f"/console/workers/{by_console.id}/disable")
    assert done.status == 303 and done.headers["Location"] == f"/console/workers/{by_console.id}"
    console_events = await events_after(gateway, before, by_console.id, key_id)
    before = await log_position(gateway)
    assert (await gateway.operator("POST", f"/v1/workers/{by_api.id}/disable")).status == 200
    assert console_events == await events_after(gateway, before, by_api.id, key_id)
    assert [t.rsplit(":", 1)[-1] for t, _ in console_events] == ["WorkerEnabledChanged", "AttemptRevoked"]
    assert console_events[0][1]["actor"] == "operator:<1>"  # the signed-in key, as in the API
    disabled = await browser.get(f"/console/workers/{by_console.id}")
    assert standing(disabled, by_console.id) == "disabled" and "/disable" not in disabled.text
    # ... and enabled again, as POST /v1/workers/{id}/enable does.
    before = await log_position(gateway)
    assert (await confirm(browser, f"/console/workers/{by_console.id}/enable")).status == 303
    console_events = await events_after(gateway, before, by_console.id, key_id)
    before = await log_position(gateway)
    assert (await gateway.operator("POST", f"/v1/workers/{by_api.id}/enable")).status == 200
    assert console_events == await events_after(gateway, before, by_api.id, key_id)
    assert [t.rsplit(":", 1)[-1] for t, _ in console_events] == ["WorkerEnabledChanged"]
    assert standing(await browser.get(f"/console/workers/{by_console.id}"), by_console.id) == "active"

    # Revoke, with a reason.
    by_console, by_api = await twins()
    before = await log_position(gateway)
    done = await confirm(browser, f"/console/workers/{by_console.id}/revoke", reason="key leaked")
    assert done.status == 303
    console_events = await events_after(gateway, before, by_console.id)
    before = await log_position(gateway)
    assert (await gateway.operator("POST", f"/v1/workers/{by_api.id}/revoke", {"reason": "key leaked"})).status == 200
    assert console_events == await events_after(gateway, before, by_api.id)
    assert [t.rsplit(":", 1)[-1] for t, _ in console_events] == ["WorkerRevoked"]
    page = await browser.get(f"/console/workers/{by_console.id}")
    assert standing(page, by_console.id) == "revoked" and "/revoke" not in page.text

    # Unassign (letting active tasks finish, as ?finish_active=true does).
    by_console, by_api = await twins()
    before = await log_position(gateway)
    done = await confirm(browser, f"/console/workers/{by_console.id}/unassign?organization_id={gateway.org}",
                         finish_active="true")
    assert done.status == 303
    console_events = await events_after(gateway, before, by_console.id, gateway.org)
    before = await log_position(gateway)
    reply = await gateway.operator("DELETE", f"/v1/workers/{by_api.id}/assignments/{gateway.org}?finish_active=true")
    assert reply.status == 200
    assert console_events == await events_after(gateway, before, by_api.id, gateway.org)
    assert [t.rsplit(":", 1)[-1] for t, _ in console_events] == ["AssignmentChanged"]
    (assignment,) = (await browser.get(f"/console/workers/{by_console.id}")).rows("Assignments")
    assert assignment[1] == "removed" and assignment[4] == "—"


async def test_a_post_without_the_token_changes_nothing(gateway: RunningGateway) -> None:
    worker = await gateway.worker()
    browser = await signed_in(gateway)
    form = await browser.get(f"/console/workers/{worker.id}/disable")
    before = await log_position(gateway)
    for path in ("disable", "revoke", f"unassign?organization_id={gateway.org}"):
        for fields in ({}, {"csrf": "forged"}, {"csrf": form.csrf + "0"}):
            refused = await browser.post(f"/console/workers/{worker.id}/{path}", fields)
            assert refused.status == 403 and "CSRF" in refused.text, (path, fields)
    assert await log_position(gateway) == before
    assert standing(await browser.get(f"/console/workers/{worker.id}"), worker.id) == "active"
    bad = await browser.get(f"/console/workers/{worker.id}/unassign?organization_id=nonsense")
    assert bad.status == 400 and "not valid" in bad.text


async def test_an_organisation_key_sees_only_its_workers_and_cannot_act(gateway: RunningGateway) -> None:
    other_org, key = await tenant(gateway, "tenant")
    foreign = await gateway.worker()  # assigned to the fixture's organisation only
    own = await gateway.worker(org=UUID(other_org))
    browser = await signed_in(gateway, key)

    listing = await browser.get("/console/workers")
    assert re.findall(r'<tr data-worker-id="([^"]+)"', listing.text) == [str(own.id)]
    before = await log_position(gateway)
    for path in ("", "/disable", "/revoke", f"/unassign?organization_id={gateway.org}"):
        page = await browser.get(f"/console/workers/{foreign.id}{path}")
        assert page.status == 404 and page.headers["Content-Type"].startswith("text/html"), path
        assert "<nav" in page.text
    for path in ("/disable", "/revoke", f"/unassign?organization_id={gateway.org}"):
        assert (await browser.post(f"/console/workers/{foreign.id}{path}", {"csrf": listing.csrf})).status == 404
    # Its own worker: visible, but the actions are an administrator's.
    detail = await browser.get(f"/console/workers/{own.id}")
    assert detail.status == 200 and "Only an administrator" in detail.text and "/disable" not in detail.text
    assert (await browser.get(f"/console/workers/{own.id}/disable")).status == 403
    assert (await browser.post(f"/console/workers/{own.id}/disable", {"csrf": listing.csrf})).status == 403
    assert await log_position(gateway) == before


async def test_unknown_console_paths_are_html_404s(gateway: RunningGateway) -> None:
    anonymous = Browser(gateway)
    for path in ("/console/nothing-here", "/console/workers/not-an-id", "/console/tasks/not-a-uuid/x"):
        page = await anonymous.get(path)
        assert page.status == 404 and page.headers["Content-Type"].startswith("text/html"), path
        assert "<main>" in page.text and "<nav" not in page.text
    browser = await signed_in(gateway)
    page = await browser.get("/console/nothing-here")
    assert page.status == 404 and "<nav" in page.text and "There is no such page" in page.text
    assert (await browser.get(f"/console/workers/{UUID(int=3)}")).status == 404


async def test_a_worker_page_lists_its_first_live_leases_and_counts_them_all(gateway: RunningGateway,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = [await gateway.task() for _ in range(3)]
    worker = await gateway.worker(capacity=3)
    for _ in tasks:
        assert (await worker.acquire()).status == 200
    monkeypatch.setattr(console_workers, "LEASES_SHOWN", 2)
    browser = await signed_in(gateway)
    (row,) = (await browser.get("/console/workers")).rows("Workers")
    assert row[6] == "3"
    page = await browser.get(f"/console/workers/{worker.id}")
    shown = page.rows("Live leases, oldest first (the first 2 of 3)")
    assert [r[0] for r in shown] == [str(t) for t in tasks[:2]]  # oldest lease first
    assert "(3)" in (await browser.get(f"/console/workers/{worker.id}/disable")).text
