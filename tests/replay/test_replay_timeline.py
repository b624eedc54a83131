"""``replay timeline``: every event in order, with actor, transition, attempt and details,
rejected stale writes included."""

from __future__ import annotations

import pytest
from replay_support import cli, cli_json

from leasehold.domain.errors import LeaseLost
from support.core import World


async def test_task_timeline_shows_transitions_attempts_and_rejected_writes(world: World, database_url: str) -> None:
    old_worker, new_worker = await world.worker(), await world.worker()
    old = await world.running(old_worker, lease_seconds=10)
    world.clock.advance(11)
    await world.lifecycle.expire_leases()
    world.clock.advance(30)
    new = await world.lifecycle.acquire(new_worker)
    assert new is not None
    with pytest.raises(LeaseLost):  # the first worker wakes up and tries to finish: fenced off
        await world.lifecycle.complete(old_worker, old.task.id, old.attempt.id, old.lease_token)
    await world.lifecycle.request_cancel(new.task.id, reason="operator says stop", actor="operator:key-1")
    await world.lifecycle.acknowledge_cancel(new_worker, new.task.id, new.attempt.id, new.lease_token)

    code, report = await cli_json("replay", "timeline", str(old.task.id), "--database-url", database_url)
    assert code == 0
    rows = [(e["version"], e["event"], e["state_before"], e["state_after"], e["attempt"], e["rejected"])
            for e in report["events"]]
    assert rows == [
        (1, "TaskCreated", None, "pending", None, False),
        (2, "TaskLeased", "pending", "leased", 1, False),
        (3, "TaskStarted", "leased", "running", 1, False),
        (4, "LeaseExpired", "running", "retry_wait", 1, False),
        (5, "TaskLeased", "retry_wait", "leased", 2, False),
        (6, "WriteRejected", "leased", "leased", 1, True),
        (7, "CancelRequested", "leased", "cancelling", None, False),
        (8, "TaskCancelled", "cancelling", "cancelled", 2, False),
    ]
    actors = [e["actor"] for e in report["events"]]
    assert actors[3] == "sweeper" and actors[5] == f"worker:{old_worker}" and actors[6] == "operator:key-1"
    assert report["events"][5]["data"] == {"command": "complete", "attempt_id": str(old.attempt.id),
                                           "reason": "superseded"}
    assert "lease_token_hash" in report["events"][1]["data"]  # auditors see the hash, never a token

    code, out, _ = await cli("replay", "timeline", str(old.task.id), "--database-url", database_url)
    assert code == 0
    assert "REJECTED complete by attempt #1: superseded" in out
    assert "retry_wait → leased" in out and "8 events, 1 rejected write" in out


async def test_scan_timeline_merges_the_scan_and_its_tasks_by_time(world: World, database_url: str) -> None:
    worker = await world.worker(capacity=2)
    first = await world.running(worker)
    world.clock.advance(2)
    second = await world.leased(worker)
    world.clock.advance(2)
    for a in (first, second):
        await world.lifecycle.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
        await world.final_batch(worker, a)
        await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)

    code, report = await cli_json("replay", "timeline", "--scan", str(world.scan), "--database-url", database_url)
    assert code == 0
    events = report["events"]
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)
    assert {e["stream_id"] for e in events} == {str(world.scan), str(first.task.id), str(second.task.id)}
    scan_rows = [(e["event"], e["state_before"], e["state_after"]) for e in events if e["stream"] == "scan"]
    assert scan_rows == [("ScanCreated", None, "pending"), ("ScanJobQueued", "pending", "pending"),
                         ("ScanJobQueued", "running", "running"), ("ScanFinished", "running", "success")]
    for task in (first, second):
        versions = [e["version"] for e in events if e["stream_id"] == str(task.task.id)]
        assert versions == sorted(versions) and versions[0] == 1
    code, out, _ = await cli("replay", "timeline", "--scan", str(world.scan), "--database-url", database_url)
    assert code == 0 and f"scan {str(world.scan)[:8]}" in out and "finished: success" in out


async def test_timeline_of_an_unknown_id_is_an_error(world: World, database_url: str) -> None:
    code, _, err = await cli("replay", "timeline", str(world.org), "--database-url", database_url)
    assert code == 1 and "OrganizationCreated stream, not a TaskCreated stream" in err
    code, _, err = await cli("replay", "timeline", "not-a-uuid", "--database-url", database_url)
    assert code == 2


async def test_timeline_json_of_a_task_stored_past_the_limits_clips_and_flags_it(
        world: World, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task created before the input limits existed (the checks switched off), its scope 252
    levels deep: inside the timeline's JSON it would nest past what JSON output can hold, so the
    event's data is clipped and flagged, and the command still answers."""
    monkeypatch.setattr("leasehold.domain.task.check_field", lambda *args, **kwargs: None)
    monkeypatch.setattr("leasehold.domain.scopes.check_field", lambda *args, **kwargs: None)
    scope: dict[str, object] = {}
    for _ in range(251):
        scope = {"a": scope}
    task = await world.task(scope=scope)
    monkeypatch.undo()
    code, report = await cli_json("replay", "timeline", str(task), "--database-url", database_url)
    assert code == 0
    (created,) = report["events"]
    assert created["event"] == "TaskCreated" and created["data_clipped"] is True
