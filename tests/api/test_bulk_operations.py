"""Bulk operations over HTTP: a preview counts, a start is tracked to the end, each task is
reached once with its outcome on record (the task's own events name the operation), the
filter is confined to the key's organisation, and refusals change nothing."""

from __future__ import annotations

import uuid
from typing import Any

from test_operator_api import assert_problem, changes, make_tenant

from support.bulk import failed_tasks
from support.gateway import RunningGateway
from support.waits import wait_until


async def finished(gateway: RunningGateway, operation: str, key: str | None = None) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        reply = await gateway.operator("GET", f"/v1/bulk-operations/{operation}", **({"key": key} if key else {}))
        assert reply.status == 200, reply.body
        return reply.body if reply.body["status"] != "running" else None
    found: dict[str, Any] = await wait_until(done, 60, what=f"bulk operation {operation} to finish")
    return found


async def test_a_bulk_retry_reaches_each_failed_task_once_and_says_so(gateway: RunningGateway) -> None:
    other = await gateway.task()  # pending: the filter leaves it out (and it keeps the scan open)
    failed = await failed_tasks(gateway.services, gateway.org, gateway.scan, 30)
    filt = {"organization_id": str(gateway.org), "state": "failed_terminal"}
    preview = await gateway.operator("POST", "/v1/bulk-previews", {"action": "retry", "filter": filt})
    assert preview.status == 200 and preview.body == {"action": "retry", "matched": 30}, preview.body

    started = await gateway.operator("POST", "/v1/bulk-operations",
                                     {"action": "retry", "filter": filt, "reason": "plugin fixed", "attempts": 2})
    assert started.status == 202 and started.body["total"] == 30, started.body
    op = started.body["id"]
    end = await finished(gateway, op)
    assert (end["status"], end["done"], end["skipped"], end["failed"]) == ("finished", 30, 0, 0), end
    assert end["actor"].startswith("operator:") and end["reason"] == "plugin fixed" and end["attempts"] == 2

    outcomes: list[dict[str, Any]] = []
    after = None
    while True:
        page = await gateway.operator("GET", f"/v1/bulk-operations/{op}/tasks?limit=7"
                                      + (f"&after={after}" if after else ""))
        outcomes += page.body["items"]
        after = page.body["next_after"]
        if after is None:
            break
    assert sorted(o["task_id"] for o in outcomes) == sorted(str(t) for t in failed)
    assert {o["outcome"] for o in outcomes} == {"done"}
    for task in failed:
        retried = int(await gateway.count(
            "SELECT count(*) FROM events WHERE originator_id = %s AND topic LIKE '%%TaskRetried'", task))
        assert retried == 1
        events = await gateway.operator("GET", f"/v1/tasks/{task}/events")
        retry = [e for e in events.body["items"] if e["type"] == "TaskRetried"]
        assert f"bulk operation {op}" in retry[0]["payload"]["reason"], retry
    assert (await gateway.operator("GET", f"/v1/tasks/{other}")).body["state"] == "pending"

    # Again: every task is pending now, so each is skipped, with the reason.
    again = await gateway.operator("POST", "/v1/bulk-operations",
                                   {"action": "retry", "filter": {"organization_id": str(gateway.org),
                                                                  "task_type": "flaky"}})
    end = await finished(gateway, again.body["id"])
    assert (end["done"], end["skipped"]) == (0, 30), end
    listed = await gateway.operator("GET", "/v1/bulk-operations")
    assert [o["id"] for o in listed.body["items"]] == [again.body["id"], op]


async def test_a_bulk_cancel_of_a_scans_pending_tasks(gateway: RunningGateway) -> None:
    tasks = [await gateway.task() for _ in range(12)]
    started = await gateway.operator("POST", "/v1/bulk-operations", {
        "action": "cancel", "filter": {"scan_id": str(gateway.scan), "state": "pending"}},
        headers={"Idempotency-Key": "cancel-them"})
    assert started.status == 202, started.body
    retried = await gateway.operator("POST", "/v1/bulk-operations", {
        "action": "cancel", "filter": {"scan_id": str(gateway.scan), "state": "pending"}},
        headers={"Idempotency-Key": "cancel-them"})
    assert retried.body["id"] == started.body["id"]  # a client's retry starts nothing more
    end = await finished(gateway, started.body["id"])
    assert end["done"] == 12
    for task in tasks:
        assert (await gateway.operator("GET", f"/v1/tasks/{task}")).body["state"] == "cancelled"


async def test_an_organisation_key_reaches_only_its_own_tasks(gateway: RunningGateway) -> None:
    mine, theirs = await make_tenant(gateway, "bulk-mine"), await make_tenant(gateway, "bulk-theirs")
    await failed_tasks(gateway.services, mine.org, mine.scan, 3)
    their_failed = await failed_tasks(gateway.services, theirs.org, theirs.scan, 2)
    before = await changes(gateway)
    foreign = await gateway.operator("POST", "/v1/bulk-previews",
                                     {"action": "retry", "filter": {"organization_id": str(theirs.org)}}, key=mine.key)
    assert_problem(foreign, 404)
    preview = await gateway.operator("POST", "/v1/bulk-previews",
                                     {"action": "retry", "filter": {"state": "failed_terminal"}}, key=mine.key)
    assert preview.body["matched"] == 3
    started = await gateway.operator("POST", "/v1/bulk-operations", {"action": "retry", "filter": {}}, key=mine.key)
    assert started.status == 202 and started.body["organization_id"] == str(mine.org)
    end = await finished(gateway, started.body["id"], key=mine.key)
    assert (end["done"], end["skipped"]) == (3, 1), end  # its failed three; its pending make_tenant task skipped
    hidden = await gateway.operator("GET", f"/v1/bulk-operations/{started.body['id']}", key=theirs.key)
    assert_problem(hidden, 404)
    for task in their_failed:
        assert (await gateway.operator("GET", f"/v1/tasks/{task}")).body["state"] == "failed_terminal"
    assert await changes(gateway) != before  # (the three retries)


async def test_refusals_change_nothing(gateway: RunningGateway) -> None:
    before = await changes(gateway)
    for body, status in (
            ({"action": "retry", "filter": {}}, 422),  # an administrator's "every task"
            ({"action": "delete", "filter": {"state": "pending"}}, 422),
            ({"action": "cancel", "filter": {"state": "pending"}, "attempts": 2}, 422),
            ({"action": "cancel", "filter": {"state": "nope"}}, 422),
            ({"action": "cancel", "filter": {"scan_id": str(uuid.uuid4()), "colour": "red"}}, 422)):
        reply = await gateway.operator("POST", "/v1/bulk-operations", body)
        assert_problem(reply, status)
    assert_problem(await gateway.operator("GET", f"/v1/bulk-operations/{uuid.uuid4()}"), 404)
    assert await changes(gateway) == before
    assert int(await gateway.count("SELECT count(*) FROM bulk_operations")) == 0


async def test_stop_answers_the_operation_and_repeating_it_changes_nothing(gateway: RunningGateway) -> None:
    """(That a stopped operation reaches no further task: tests/core/test_bulk_runner.py.)"""
    started = await gateway.operator("POST", "/v1/bulk-operations", {
        "action": "cancel", "filter": {"scan_id": str(gateway.scan)}})
    stopped = await gateway.operator("POST", f"/v1/bulk-operations/{started.body['id']}/stop")
    assert stopped.status == 200 and stopped.body["status"] in ("stopped", "finished"), stopped.body
    again = await gateway.operator("POST", f"/v1/bulk-operations/{started.body['id']}/stop")
    assert again.body["status"] == stopped.body["status"]
