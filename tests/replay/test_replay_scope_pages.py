"""The log commits to every task's whole scope: ``TaskCreated`` lists the sha256 of each stored page,
``replay verify`` names a page that was changed or deleted, and a task created before scopes were
paged (its whole scope inline in ``TaskCreated``, however large) still rebuilds to its live row."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import orjson
import psycopg
from replay_support import cli_json, tamper

from leasehold.domain.events import TaskCreated
from leasehold.persistence.chain import GENESIS, chain_hash
from leasehold.persistence.codec import decode_event
from support.core import World, assert_log_rebuilds_live

BIG = {"targets": ["10.0.0.0/24"],
       "assets": [{"kind": "service", "value": f"10.0.0.{n % 250}:{1000 + n}/tcp"} for n in range(4_000)]}


def task_row(url: str, task_id: UUID) -> tuple[Any, ...]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT scope, scope_ref, scope_pages FROM worker_tasks WHERE id = %s", (task_id,)).fetchone()
    assert row is not None
    return tuple(row)


async def verify(database_url: str) -> tuple[int, list[tuple[str, list[str], str, list[str]]]]:
    code, report = await cli_json("replay", "verify", "--database-url", database_url)
    return code, [(d["table"], d["key"], d["kind"], list(d["columns"])) for d in report["differences"]]


async def test_the_created_event_lists_every_stored_page_and_verify_names_a_changed_or_missing_one(
        world: World, database_url: str) -> None:
    task_id = await world.task(scope=BIG)
    _, ref, pages = task_row(database_url, task_id)
    assert ref["assets"] == 4_000 and len(pages) == ref["pages"] - 1 >= 2
    with psycopg.connect(database_url) as conn:
        state = conn.execute("SELECT state FROM events WHERE originator_id = %s AND originator_version = 1",
                             (task_id,)).fetchone()
    assert state is not None
    created = orjson.loads(state[0])
    assert created["scope_pages"] == pages and created["scope_sha256"] == ref["sha256"]
    assert await verify(database_url) == (0, [])

    tamper(database_url, ("UPDATE scope_pages SET body = %s WHERE sha256 = %s",
                          (orjson.dumps([{"kind": "service", "value": "10.6.6.6:22/tcp"}]), pages[0])),
           ("DELETE FROM scope_pages WHERE sha256 = %s", (pages[1],)))
    assert await verify(database_url) == (1, sorted([
        ("scope_pages", [pages[0]], "changed", ["sha256"]), ("scope_pages", [pages[1]], "missing_live", [])],
        key=lambda d: d[1]))


async def test_a_task_created_before_scopes_were_paged_rebuilds_with_its_whole_scope_inline(
        world: World, database_url: str) -> None:
    """What a database migrated from before revision 0019 holds: a ``TaskCreated`` with the whole
    scope (here larger than a page) and no scope reference, and a row without one."""
    task_id = await world.task(scope={"targets": ["h"]})
    old = orjson.loads(_created_state(database_url, task_id))
    assert not [key for key in old if key.startswith("scope_")]  # a small scope's event, as before
    old["scope"] = BIG
    state = orjson.dumps(old)
    head = chain_hash(GENESIS, task_id, 1, "domain.events:TaskCreated", state)
    tamper(database_url,
           ("UPDATE events SET state = %s, hash = %s WHERE originator_id = %s AND originator_version = 1",
            (state, head, task_id)),
           ("UPDATE worker_tasks SET scope = %s, scope_ref = NULL, head_hash = %s WHERE id = %s",
            (orjson.dumps(BIG).decode(), head, task_id)))
    event = decode_event(task_id, 1, "domain.events:TaskCreated", state)
    assert isinstance(event, TaskCreated) and event.scope == BIG
    assert (event.scope_sha256, event.scope_pages, event.scope_assets) == (None, (), None)
    await assert_log_rebuilds_live(database_url)
    assert task_row(database_url, task_id) == (BIG, None, None)


def _created_state(url: str, task_id: UUID) -> bytes:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT state, topic FROM events WHERE originator_id = %s AND originator_version = 1",
                           (task_id,)).fetchone()
    assert row is not None and row[1] == "domain.events:TaskCreated"
    return bytes(row[0])
