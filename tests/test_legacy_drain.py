"""``leasehold legacy drain`` against the machine's Redis and a real PostgreSQL, run as the CLI
(``cli.main.main`` with argv, in a thread; once in a subprocess).

Every test uses its own queue name (a fresh key prefix) and deletes its keys afterwards. Without
a Redis answering at ``$TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379``) the tests skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import pytest

from leasehold.cli import legacy as legacy_cli
from leasehold.cli.main import main
from leasehold.domain.events import ProfileStep
from support.core import World, assert_log_rebuilds_live

redis = pytest.importorskip("redis")

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379")
LEASEHOLD = Path(sys.executable).with_name("leasehold")


@pytest.fixture
def queue() -> Iterator[tuple[Any, str]]:
    """(a Redis client, a queue name no other test uses); every key under it is deleted after."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis answers at {REDIS_URL} ({exc}); set TEST_REDIS_URL to run the drain tests")
    name = f"leasehold-test:{uuid.uuid4().hex}:scans"
    try:
        yield client, name
    finally:
        keys = list(client.scan_iter(match=f"{name}*"))
        if keys:
            client.delete(*keys)
        client.close()


def _message(org: UUID, legacy_id: str | int, **fields: Any) -> bytes:
    body = {"scan_id": legacy_id, "organization_id": str(org), "targets": ["10.0.0.5"], **fields}
    if "profile" not in body and "steps" not in body:
        body["steps"] = ["discover", {"task_type": "portscan", "lease_seconds": 120}]
    return orjson.dumps(body)


def _run_cli(*argv: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, stdout.getvalue(), stderr.getvalue()


async def drain(database_url: str, name: str, *extra: str) -> tuple[int, str, str]:
    return await asyncio.to_thread(_run_cli, "legacy", "drain", "--redis-url", REDIS_URL, "--queue", name,
                                   "--database-url", database_url, *extra)


async def _rows(world: World, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with world.pool.connection() as conn:
        cur = await conn.execute(query, params)
        return list(await cur.fetchall())


async def _gateway_scans(world: World) -> dict[str, tuple[Any, ...]]:
    """Gateway scans made from legacy ids: legacy id -> (scan id, status, stored profile, targets)."""
    rows = await _rows(world, "SELECT legacy_scan_id, id, status, stored_profile_id, targets FROM scans"
                              " WHERE execution_mode = 'gateway' AND legacy_scan_id IS NOT NULL")
    scans = {r[0]: r[1:] for r in rows}
    assert len(scans) == len(rows), "a legacy scan id with two Gateway scans"
    return scans


async def test_draining_twice_creates_each_scan_once(world: World, database_url: str, queue: Any) -> None:
    client, name = queue
    profile = await world.services.profiles.create(world.org, name="legacy-default",
                                                          steps=(ProfileStep(task_type="discover"),))
    first = _message(world.org, "L-1")
    client.lpush(name, first, _message(world.org, 2, profile="legacy-default"),
                 _message(world.org, "L-3", targets={"targets": ["h"], "ports": [443]}), first)
    code, out, err = await drain(database_url, name)
    assert code == 0, err
    assert "#1 converted: legacy scan L-1" in out and "#4 already converted: legacy scan L-1" in out, out
    assert "done: 4 messages from" in out and "3 converted, 1 already converted, 0 refused, 0 invalid" in out, out
    scans = await _gateway_scans(world)
    assert set(scans) == {"L-1", "2", "L-3"}
    assert scans["2"][2] == profile and scans["L-3"][3] == {"targets": ["h"], "ports": [443]}
    assert await _rows(world, "SELECT t.task_type, t.scope FROM worker_tasks t JOIN scans s ON s.id = t.scan_id"
                              " WHERE s.legacy_scan_id = 'L-1'") == [("discover", {"targets": ["10.0.0.5"]})]
    assert client.llen(name) == client.llen(f"{name}:processing") == 0

    code, out, _ = await drain(database_url, name)  # again: nothing left to do
    assert code == 0 and "done: 0 messages" in out, out
    client.lpush(name, first)  # the legacy API sent it once more
    code, out, _ = await drain(database_url, name)
    assert code == 0 and "already converted: legacy scan L-1" in out, out
    assert await _gateway_scans(world) == scans
    assert client.llen(f"{name}:refused") == client.llen(f"{name}:invalid") == 0
    await assert_log_rebuilds_live(database_url)


async def test_a_crash_between_commit_and_removal_still_creates_the_scan_once(
        world: World, database_url: str, queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    client, name = queue
    message = _message(world.org, "L-crash")
    client.lpush(name, message, _message(world.org, "L-next"))

    async def crash(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # the process dies right after the commit, before LREM

    monkeypatch.setattr(legacy_cli, "_acknowledge", crash)
    code, _, err = await drain(database_url, name)
    assert code == 1 and "interrupted" in err, err
    monkeypatch.undo()
    assert set(await _gateway_scans(world)) == {"L-crash"}  # committed ...
    assert client.lrange(f"{name}:processing", 0, -1) == [message]  # ... and still being handled

    # Meanwhile a worker already started the scan: the re-handled message is still recognised.
    worker = await world.worker(task_types=("discover",))
    leased = await world.lifecycle.acquire(worker)
    assert leased is not None and leased.task.scan_id == (await _gateway_scans(world))["L-crash"][0]
    code, out, err = await drain(database_url, name)
    assert code == 0, err
    assert "#1 already converted: legacy scan L-crash" in out and "#2 converted: legacy scan L-next" in out, out
    assert set(await _gateway_scans(world)) == {"L-crash", "L-next"}
    assert client.llen(f"{name}:processing") == client.llen(f"{name}:refused") == 0


async def test_scans_already_running_in_either_mode_are_refused(world: World, database_url: str,
                                                                queue: Any) -> None:
    client, name = queue
    legacy = world.services.legacy
    running = await world.scans.create_scan(world.org, {}, execution_mode="legacy", legacy_scan_id="L-running")
    await legacy.record_status(running, "running")
    pending = await world.scans.create_scan(world.org, {}, profile=(ProfileStep(task_type="discover"),),
                                               execution_mode="legacy", legacy_scan_id="L-pending")
    started = _message(world.org, "L-started")
    client.lpush(name, started)
    assert (await drain(database_url, name))[0] == 0
    worker = await world.worker(task_types=("discover",))
    assert await world.lifecycle.acquire(worker) is not None  # L-started now runs on the Gateway

    other_org = await world.registry.create_organization("still-legacy")
    await world.registry.set_gateway_execution(other_org, False)
    refused = [_message(world.org, "L-running"), started, _message(other_org, "L-flag")]
    client.lpush(name, *refused, _message(world.org, "L-pending"))
    code, out, err = await drain(database_url, name)
    assert code == 0, err
    assert f"refused: legacy scan L-running: already running in legacy mode (scan {running})" in out, out
    assert "refused: legacy scan L-started: already running in Gateway mode" in out, out
    assert "refused: legacy scan L-flag: organisation" in out and "legacy-executed" in out, out
    assert f"-> moved to {name}:refused" in out and f"see {name}:refused" in out, out
    # Pushed as the producers push: the oldest at the right end, as it was in the queue.
    assert client.lrange(f"{name}:refused", 0, -1) == list(reversed(refused))
    assert set(await _gateway_scans(world)) == {"L-started", "L-pending"}

    # The queued legacy record was handed over: it and its job end cancelled, pointing at the new scan.
    new = (await _gateway_scans(world))["L-pending"][0]
    assert await _rows(world, "SELECT status, handed_over_to FROM scans WHERE id = %s", pending) == [
        ("cancelled", new)]
    assert await _rows(world, "SELECT status, execution_mode FROM scan_jobs WHERE scan_id = %s", pending) == [
        ("cancelled", "legacy")]
    assert await _rows(world, "SELECT status FROM scans WHERE id = %s", running) == [("running",)]
    await assert_log_rebuilds_live(database_url)


async def test_unreadable_messages_are_dead_letters_unknown_names_invalid_and_the_drain_goes_on(
        world: World, database_url: str, queue: Any) -> None:
    client, name = queue
    dead = [
        b"{not json",
        b'["a", "list"]',
        orjson.dumps({"scan_id": "x", "targets": []}),  # no organisation
        _message(world.org, "L-both", profile="p", steps=["discover"]),
        _message(world.org, "L-bad-step", steps=[{"task_type": "discover", "lease_seconds": 0}]),
        _message(world.org, "", steps=["discover"]),
        _message(world.org, "L-nul", targets=["10.0.0.5\x00"]),  # PostgreSQL stores no NUL
        _message(world.org, "L-nul-\x00-id"),
    ]
    invalid = [_message(UUID(int=12345), "L-unknown-org"), _message(world.org, "L-unknown-profile", profile="nowhere")]
    client.lpush(name, dead[0], dead[1], invalid[0], dead[2], _message(world.org, "L-good"), *dead[3:], invalid[1],
                 _message(world.org, "L-after"))
    events = (await _rows(world, "SELECT count(*) FROM events"))[0][0]
    code, out, err = await drain(database_url, name)
    assert code == 0, err
    for reason in ("not JSON", "a message is a JSON object", "organization_id: Field required",
                   "no such organisation", "no such profile", "exactly one of profile", "lease_seconds",
                   "scan_id", "NUL character"):
        assert reason in out, (reason, out)
    assert "10.0.0.5" not in out  # a dead letter is named by its size and sha256, never its content
    assert out.count("dead-lettered: message of ") == len(dead), out
    assert out.count(f"-> moved to {name}:dead") == len(dead), out
    assert out.count(f"-> moved to {name}:invalid") == len(invalid), out
    assert sorted(client.lrange(f"{name}:dead", 0, -1)) == sorted(dead)
    assert sorted(client.lrange(f"{name}:invalid", 0, -1)) == sorted(invalid)
    assert set(await _gateway_scans(world)) == {"L-good", "L-after"}
    assert (await _rows(world, "SELECT count(*) FROM events"))[0][0] > events
    assert client.llen(name) == client.llen(f"{name}:processing") == 0
    assert f"{len(dead)} dead" in out.splitlines()[-1]

    # The operator sees them with their reasons, and requeues one (after fixing its producer).
    code, out, err = await asyncio.to_thread(_run_cli, "legacy", "dead-letters", "list", "--redis-url", REDIS_URL,
                                             "--queue", name, "--json")
    assert code == 0, err
    listed = [orjson.loads(line) for line in out.splitlines()]
    assert [entry["message"].encode() for entry in listed[:3]] == dead[:3]  # oldest first
    assert sum("NUL character" in entry["reason"] for entry in listed) == 2
    code, out, err = await asyncio.to_thread(_run_cli, "legacy", "dead-letters", "requeue", "--redis-url", REDIS_URL,
                                             "--queue", name, "--sha256", listed[0]["sha256"][:12])
    assert code == 0 and "1 dead letter requeued" in out, (out, err)
    assert client.lrange(name, 0, -1) == [dead[0]]
    assert client.llen(f"{name}:dead") == len(dead) - 1
    assert client.hexists(f"{name}:dead:reasons", listed[0]["sha256"]) == 0
    code, out, err = await asyncio.to_thread(_run_cli, "legacy", "dead-letters", "requeue", "--redis-url", REDIS_URL,
                                             "--queue", name, "--all")
    assert code == 0 and f"{len(dead) - 1} dead letters requeued" in out, (out, err)
    assert client.llen(f"{name}:dead") == 0 and client.llen(name) == len(dead)
    code, out, err = await drain(database_url, name)  # still unreadable: back to the dead letters, exit 0
    assert code == 0 and client.llen(f"{name}:dead") == len(dead), (out, err)


async def test_a_dry_run_changes_nothing(world: World, database_url: str, queue: Any) -> None:
    client, name = queue
    messages = [_message(world.org, "L-a"), b"nope", _message(world.org, "L-a"), _message(world.org, "L-b")]
    client.lpush(name, *messages)
    client.lpush(f"{name}:processing", _message(world.org, "L-left-over"))
    events = await _rows(world, "SELECT count(*) FROM events")
    code, out, err = await drain(database_url, name, "--dry-run")
    assert code == 0, err
    assert [line.split(":")[0] for line in out.splitlines()[:5]] == [
        "#1 would be converted", "#2 would be converted", "#3 would be dead-lettered", "#4 would be already converted",
        "#5 would be converted"], out
    assert "dry run, nothing changed: 5 messages" in out, out
    assert client.lrange(name, 0, -1) == list(reversed(messages))
    assert client.llen(f"{name}:processing") == 1 and client.llen(f"{name}:invalid") == client.llen(f"{name}:dead") == 0
    assert await _rows(world, "SELECT count(*) FROM events") == events


async def test_limit_stops_early_and_leaves_the_rest_queued(world: World, database_url: str, queue: Any) -> None:
    client, name = queue
    client.lpush(name, *(_message(world.org, f"L-{n}") for n in range(3)))
    code, out, _ = await drain(database_url, name, "--limit", "2")
    assert code == 0 and "done: 2 messages" in out, out
    assert set(await _gateway_scans(world)) == {"L-0", "L-1"} and client.llen(name) == 1
    assert client.llen(f"{name}:processing") == 0


def test_unreachable_redis_or_database_exit_non_zero(database_url: str, queue: Any) -> None:
    client, name = queue
    client.lpush(name, b"{}")
    for redis_url, db_url, what in [("redis://127.0.0.1:1", database_url, "cannot reach Redis"),
                                    (REDIS_URL, "postgresql://postgres@127.0.0.1:1/nowhere", "cannot reach PostgreSQL")]:
        done = subprocess.run([str(LEASEHOLD), "legacy", "drain", "--redis-url", redis_url, "--queue", name,
                               "--database-url", db_url], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 1 and what in done.stderr, done
    assert client.lrange(name, 0, -1) == [b"{}"]  # untouched
    usage = subprocess.run([str(LEASEHOLD), "legacy", "drain", "--queue", name], capture_output=True, text=True,
                           timeout=60, check=False)
    assert usage.returncode == 2 and "--redis-url" in usage.stderr


async def test_two_organisations_may_use_the_same_legacy_id(world: World, database_url: str, queue: Any) -> None:
    """Legacy ids are unique per organisation: each organisation's message converts, in a dry run too."""
    client, name = queue
    other = await world.registry.create_organization("other-legacy-system")
    client.lpush(name, _message(world.org, "L-shared"), _message(other, "L-shared"))
    code, out, err = await drain(database_url, name, "--dry-run")
    assert code == 0 and out.count("converted: legacy scan L-shared") == 2, (out, err)
    code, out, err = await drain(database_url, name)
    assert code == 0, err
    assert "2 converted, 0 already converted, 0 refused" in out, out
    assert await _rows(world, "SELECT count(DISTINCT organization_id) FROM scans WHERE legacy_scan_id = 'L-shared'"
                              " AND execution_mode = 'gateway'") == [(2,)]


async def test_a_full_admission_cap_stops_the_drain_and_leaves_the_message_to_convert_later(
        world: World, database_url: str, queue: Any) -> None:
    client, name = queue
    await world.registry.set_admission(world.org, max_queued_tasks=None, max_queued_scans=0, reason="full")
    client.lpush(name, _message(world.org, "L-full"))
    code, _out, err = await drain(database_url, name)
    assert code != 0 and "run the drain again" in err, err
    assert await _gateway_scans(world) == {}
    assert client.llen(f"{name}:invalid") == client.llen(f"{name}:refused") == 0
    assert client.llen(name) + client.llen(f"{name}:processing") == 1  # kept, not parked as invalid
    await world.registry.set_admission(world.org, max_queued_tasks=None, max_queued_scans=None, reason="room")
    code, out, err = await drain(database_url, name)
    assert code == 0 and "1 converted" in out, (out, err)
    assert set(await _gateway_scans(world)) == {"L-full"}
