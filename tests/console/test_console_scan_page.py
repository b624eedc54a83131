"""The scan pages' additions: the creation-time filter of the list, the assets a scan found, and
the Cancel form, which runs the API's cancel command."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from support.console import signed_in, state_of
from support.gateway import RunningGateway, tenant


async def test_scans_filter_by_creation_time(gateway: RunningGateway) -> None:
    old = await gateway.scans.create_scan(gateway.org, {"targets": ["127.0.0.1"]})
    async with gateway.pool.connection() as conn:
        await conn.execute("UPDATE scans SET created_at = '2026-01-01T10:00:00+00' WHERE id = %s", (old,))
    browser = await signed_in(gateway)
    cut = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")
    recent = (await browser.get(f"/console/scans?created_from={cut}")).rows("Scans")
    assert [r[0] for r in recent] == [str(gateway.scan)]
    before = await browser.get("/console/scans?created_to=2026-01-01T10:00:01&created_from=2026-01-01T09:00:00%2B00:00")
    assert [r[0] for r in before.rows("Scans")] == [str(old)]
    assert 'value="2026-01-01T10:00:01"' in before.text and 'value="2026-01-01T09:00:00"' in before.text
    assert (await browser.get("/console/scans?created_from=yesterday")).status == 400


async def test_a_scan_shows_its_assets_and_cancels_with_the_api_command(gateway: RunningGateway) -> None:
    task_id = await gateway.task()
    worker = await gateway.worker()
    lease = (await worker.acquire()).body["lease"]
    assert (await worker.final_batch(lease, [{"type": "asset", "kind": "host", "value": "a.example"}])).status == 200
    waiting = await gateway.task()
    browser = await signed_in(gateway)

    page = await browser.get(f"/console/scans/{gateway.scan}")
    assert [(r[0], r[1]) for r in page.rows("Assets found")] == [("host", "a.example")]
    assert "Cancel this scan" in page.text
    assert (await browser.post(f"/console/scans/{gateway.scan}/cancel", {"reason": "x"})).status == 403
    assert await state_of(gateway, waiting) == "pending"

    # Another organisation's key: 404, nothing cancelled.
    _, key = await tenant(gateway, "other")
    outsider = await signed_in(gateway, key)
    token = (await outsider.get("/console")).csrf
    assert (await outsider.post(f"/console/scans/{gateway.scan}/cancel", {"csrf": token})).status == 404
    assert await state_of(gateway, waiting) == "pending"

    done = await browser.post(f"/console/scans/{gateway.scan}/cancel", {"csrf": page.csrf, "reason": "wrong target"})
    assert done.status == 303 and done.headers["Location"] == f"/console/scans/{gateway.scan}"
    assert await state_of(gateway, waiting) == "cancelled" and await state_of(gateway, task_id) == "cancelling"
    event = await gateway.count("SELECT convert_from(state, 'UTF8') FROM events WHERE originator_id = %s "
                                "AND topic LIKE '%%ScanCancelRequested'", UUID(str(gateway.scan)))
    assert '"reason":"wrong target"' in event and '"actor":"operator:' in event
    # Once the worker acknowledges, the scan is cancelled and offers no more cancel.
    assert (await worker.write(lease, "cancel-ack")).status == 200
    after = await browser.get(f"/console/scans/{gateway.scan}")
    assert after.rows("The scan")[0][1] == "cancelled" and "Cancel this scan" not in after.text
