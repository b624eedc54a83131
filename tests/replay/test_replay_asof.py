"""``replay as-of``: a task (or scan) as it was at a past moment, folded from its events."""

from __future__ import annotations

from datetime import timedelta

import psycopg
from replay_support import cli, cli_json

from support.core import World


async def test_as_of_between_lease_and_completion_shows_the_live_attempt(world: World, database_url: str) -> None:
    worker = await world.worker()
    created = world.clock.now
    await world.task()
    world.clock.advance(5)
    a = await world.lifecycle.acquire(worker)
    assert a is not None
    leased = world.clock.now
    world.clock.advance(10)
    await world.lifecycle.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
    started = world.clock.now
    world.clock.advance(20)
    await world.lifecycle.renew(worker, a.task.id, a.attempt.id, a.lease_token)
    renewed = world.clock.now
    world.clock.advance(10)
    await world.final_batch(worker, a)
    await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)
    completed = world.clock.now
    url = ("--database-url", database_url)

    async def state_at(moment: object) -> dict[str, object]:
        code, report = await cli_json("replay", "as-of", moment.isoformat(), str(a.task.id), *url)  # type: ignore[attr-defined]
        assert code == 0
        return report  # type: ignore[no-any-return]

    leased_view = await state_at(leased + timedelta(seconds=1))
    assert leased_view["task"]["state"] == "leased"
    attempt = leased_view["task"]["attempt"]
    assert (attempt["id"], attempt["number"], attempt["status"], attempt["worker_id"]) == (
        str(a.attempt.id), 1, "leased", str(worker))
    assert attempt["leased_at"] == leased.isoformat()
    assert attempt["lease_expires_at"] == (leased + timedelta(seconds=60)).isoformat()

    running_view = await state_at(renewed + timedelta(seconds=1))
    assert running_view["task"]["state"] == "running"
    assert running_view["task"]["attempt"]["number"] == 1
    assert running_view["task"]["attempt"]["started_at"] == started.isoformat()
    assert running_view["task"]["attempt"]["lease_expires_at"] == (renewed + timedelta(seconds=60)).isoformat()

    assert (await state_at(created - timedelta(seconds=1)))["task"] is None
    assert (await state_at(created))["task"]["state"] == "pending"
    done = await state_at(completed)
    assert (done["task"]["state"], done["events_folded"], done["events_total"]) == ("completed", 6, 6)

    code, out, _ = await cli("replay", "as-of", (started + timedelta(seconds=1)).isoformat(), str(a.task.id), *url)
    assert code == 0 and "running" in out and f"#1 {a.attempt.id} (running)" in out


async def test_as_of_during_a_retry_shows_the_second_attempt_and_the_scan(world: World, database_url: str) -> None:
    worker = await world.worker()
    first = await world.running(worker, max_attempts=3)
    await world.lifecycle.fail(worker, first.task.id, first.attempt.id, first.lease_token, error="boom")
    world.clock.advance(600)
    second = await world.lifecycle.acquire(worker)
    assert second is not None and second.task.id == first.task.id
    during = world.clock.now
    world.clock.advance(1)
    await world.lifecycle.mark_running(worker, second.task.id, second.attempt.id, second.lease_token)
    await world.final_batch(worker, second)
    await world.lifecycle.complete(worker, second.task.id, second.attempt.id, second.lease_token)

    code, report = await cli_json("replay", "as-of", during.isoformat(), str(first.task.id),
                                  "--database-url", database_url)
    assert report["task"]["state"] == "leased" and report["task"]["attempt"]["number"] == 2
    assert report["task"]["last_error"] == "boom"

    code, scan = await cli_json("replay", "as-of", during.isoformat(), "--scan", str(world.scan),
                                "--database-url", database_url)
    assert code == 0
    assert scan["scan"]["status"] == "running"
    assert [(j["status"], j["plugin"]) for j in scan["jobs"]] == [("running", "probe")]
    assert [t["task"]["state"] for t in scan["tasks"]] == ["leased"]
    code, scan = await cli_json("replay", "as-of", world.clock.now.isoformat(), "--scan", str(world.scan),
                                "--database-url", database_url)
    assert (scan["scan"]["status"], scan["jobs"][0]["status"]) == ("success", "success")


async def test_as_of_by_recorded_time(world: World, database_url: str) -> None:
    worker = await world.worker()
    a = await world.running(worker)
    await world.final_batch(worker, a)
    await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)
    with psycopg.connect(database_url) as conn:
        recorded = dict(conn.execute(  # type: ignore[arg-type]
            "SELECT split_part(topic, ':', 2), recorded_at FROM events WHERE originator_id = %s",
            (a.task.id,)).fetchall())
    code, report = await cli_json("replay", "as-of", recorded["TaskStarted"].isoformat(), str(a.task.id),
                                  "--clock", "recorded", "--database-url", database_url)
    assert code == 0 and report["task"]["state"] == "running"


async def test_as_of_rejects_unknown_ids_and_bad_times(world: World, database_url: str) -> None:
    url = ("--database-url", database_url)
    code, _, err = await cli("replay", "as-of", "2030-01-01T00:00:00", str(world.scan), *url)
    assert code == 1 and "is a ScanCreated stream, not a TaskCreated stream" in err
    code, _, err = await cli("replay", "as-of", "yesterday", str(world.scan), *url)
    assert code == 2 and "not an ISO 8601 time" in err
    code, _, err = await cli("replay", "as-of", "2030-01-01T00:00:00", *url)
    assert code == 2 and "exactly one of TASK_ID or --scan" in err
