"""The task page's time axis (inline SVG, one group per attempt, with its marks) and the table
that repeats it, and the Retry form, which runs the API's retry command."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any
from uuid import UUID

from leasehold.domain.retry import RetryPolicy
from support.console import signed_in, wait_for_state
from support.gateway import RunningGateway, tenant


class _Axis(HTMLParser):
    """The attempt groups of ``svg#attempts-axis``: their data attributes and the classes of their marks."""

    def __init__(self) -> None:
        super().__init__()
        self.svg: dict[str, str | None] | None = None
        self.attempts: list[dict[str, Any]] = []
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "svg" and found.get("id") == "attempts-axis":
            self.svg, self._depth = found, 1
            return
        if not self._depth:
            return
        if tag == "g" and found.get("class") == "attempt":
            self.attempts.append({"attempt": found["data-attempt"], "outcome": found["data-outcome"], "marks": []})
        elif (classes := (found.get("class") or "").split()) and classes[0] == "mark" and self.attempts:
            self.attempts[-1]["marks"].append(classes[1])

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg" and self._depth:
            self._depth = 0


def axis_of(text: str) -> _Axis:
    parser = _Axis()
    parser.feed(text)
    assert parser.svg is not None, text
    return parser


async def test_an_expired_then_retried_attempt_is_drawn_twice(gateway: RunningGateway) -> None:
    gateway.lifecycle.retry_policy = RetryPolicy(base_seconds=0.05, cap_seconds=0.05)  # retried at once
    task_id = await gateway.task(lease_seconds=1)
    worker = await gateway.worker()
    assert (await worker.acquire()).status == 200
    await wait_for_state(gateway, task_id, ("retry_wait", "pending"))  # the first lease expired
    second = await worker.acquire_offered(what="the retry once its backoff is over")
    lease = second.body["lease"]
    assert (await worker.write(lease, "renew")).status == 200
    assert (await worker.final_batch(lease)).status == 200
    browser = await signed_in(gateway)

    page = await browser.get(f"/console/tasks/{task_id}")
    axis = axis_of(page.text)
    assert axis.svg is not None and axis.svg["role"] == "img" and "attempt 1 expired" in (axis.svg["aria-label"] or "")
    async with gateway.pool.connection() as conn:
        cur = await conn.execute("SELECT attempt_number::text, status FROM worker_task_attempts WHERE task_id = %s "
                                 "ORDER BY attempt_number", (task_id,))
        in_database = await cur.fetchall()
    assert [(a["attempt"], a["outcome"]) for a in axis.attempts] == in_database == [("1", "expired"),
                                                                                    ("2", "running")]
    first, retried = axis.attempts
    assert first["marks"][0] == "grant" and "lease-expiry" in first["marks"] and "end" in first["marks"]
    assert "deadline" in first["marks"] and "renewal" not in first["marks"]
    assert retried["marks"].count("renewal") == 1 and retried["marks"].count("batch") == 1
    assert "lease-expiry" in retried["marks"] and "end" not in retried["marks"]  # live: its lease runs out later
    # The same data, as a table.
    rows = page.rows("Time axis")
    assert [(r[0], r[1]) for r in rows] == in_database
    assert rows[0][3] == "0" and rows[1][3].startswith("1: ") and rows[1][6].startswith("1: ")
    assert rows[0][7] != "—" and rows[1][7] == "—"


async def test_retry_runs_the_api_command_for_a_failed_task_only(gateway: RunningGateway) -> None:
    task_id = await gateway.task(max_attempts=1)
    running = await gateway.task()
    worker = await gateway.worker()
    lease = (await worker.acquire()).body["lease"]
    assert lease["task"]["id"] == str(task_id)
    assert (await worker.write(lease, "fail", error="boom", retryable=False)).status == 200
    assert await wait_for_state(gateway, task_id, ("failed_terminal",)) == "failed_terminal"
    browser = await signed_in(gateway)

    assert "/retry" not in (await browser.get(f"/console/tasks/{running}")).text
    page = await browser.get(f"/console/tasks/{task_id}")
    assert re.search(rf'<form method="post" action="/console/tasks/{task_id}/retry">', page.text)
    assert "Cancel this task" not in page.text and '<label for="attempts">' in page.text
    assert (await browser.post(f"/console/tasks/{task_id}/retry", {"attempts": "2"})).status == 403
    bad = await browser.post(f"/console/tasks/{task_id}/retry", {"csrf": page.csrf, "attempts": "many"})
    assert bad.status == 400
    assert await gateway.count("SELECT state FROM worker_tasks WHERE id = %s", task_id) == "failed_terminal"

    done = await browser.post(f"/console/tasks/{task_id}/retry", {"csrf": page.csrf, "attempts": "2",
                                                                  "reason": "fixed the target"})
    assert done.status == 303 and done.headers["Location"] == f"/console/tasks/{task_id}"
    events = (await gateway.operator("GET", f"/v1/tasks/{task_id}/events")).body["items"]
    assert events[-1]["type"] == "TaskRetried" and events[-1]["actor"].startswith("operator:")
    assert events[-1]["payload"]["reason"] == "fixed the target" and events[-1]["payload"]["max_attempts"] == 3
    after = await browser.get(f"/console/tasks/{task_id}")
    assert "/retry" not in after.text and "Cancel this task" in after.text  # pending again
    # Retrying a task in any other state is the API's 409, shown as a page.
    refused = await browser.post(f"/console/tasks/{running}/retry", {"csrf": page.csrf})
    assert refused.status == 409 and refused.headers["Content-Type"].startswith("text/html")

    # Another organisation's key: a 404, and nothing retried.
    _, key = await tenant(gateway, "other")
    outsider = await signed_in(gateway, key)
    token = (await outsider.get("/console")).csrf
    assert (await outsider.post(f"/console/tasks/{task_id}/retry", {"csrf": token})).status == 404
    assert await gateway.count("SELECT count(*) FROM events WHERE originator_id = %s AND topic LIKE %s",
                               UUID(str(task_id)), "%TaskRetried") == 1
