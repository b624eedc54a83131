"""Migration 0022 with data in it: the unfinished tasks stored before the input limits, whose
scope or parameters break them, are listed by the migration and ended on the record by the
Gateway's own command path; the log still rebuilds the live rows."""

from __future__ import annotations

import asyncio
import random
from typing import Any
from uuid import UUID

import psycopg
import pytest

from leasehold.domain.events import CancelRequested, TaskCancelled
from leasehold.gateway.commands.lifecycle import UNDELIVERABLE
from leasehold.gateway.services import build_services
from leasehold.gateway.tls import PkiPaths
from leasehold.migrations import runner as migrate
from leasehold.persistence.connection import connect, create_pool
from leasehold.persistence.event_log import read_stream
from leasehold.persistence.transaction import Database
from support.core import ManualClock, World, assert_log_rebuilds_live
from support.gateway import running_gateway
from support.migrations import revision_module


def nested(levels: int) -> dict[str, Any]:
    """A JSON object nesting ``levels`` deep (``{"a": {"a": … {}}}``)."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def listed(url: str) -> set[UUID]:
    with psycopg.connect(url) as conn:
        return {task for (task,) in conn.execute("SELECT task_id FROM undeliverable_tasks").fetchall()}


def state(url: str, task: UUID) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT state FROM worker_tasks WHERE id = %s", (task,)).fetchone()
    assert row is not None
    return str(row[0])


async def test_tasks_stored_past_the_limits_are_listed_and_ended_on_the_record(
        world: World, database_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    worker = await world.worker()
    # Created as before the limits existed: the service layer's depth check switched off.
    monkeypatch.setattr("leasehold.domain.task.check_field", lambda *args, **kwargs: None)
    monkeypatch.setattr("leasehold.domain.scopes.check_field", lambda *args, **kwargs: None)
    leased = (await world.leased(worker, scope=nested(40))).task.id
    deep_scope = await world.task(scope=nested(252))
    deep_parameters = await world.task(parameters={"p": nested(33)})
    at_the_limit = await world.task(scope=nested(32), parameters={"p": nested(31)})
    done = await world.task(scope=nested(40))
    await world.lifecycle.request_cancel(done)
    monkeypatch.undo()
    ordinary = await world.task(scope={"targets": ["127.0.0.1"]})
    await world.services.db.pool.close()  # nothing may hold the tables while the schema changes

    assert migrate.downgrade(database_url, "0021") == "0021"
    assert migrate.upgrade(database_url, "head") == migrate.head()
    assert listed(database_url) == {leased, deep_scope, deep_parameters}
    assert state(database_url, deep_scope) == "pending"  # listed only: the migration appends nothing
    await assert_log_rebuilds_live(database_url)

    async with create_pool(database_url, min_size=1, max_size=4) as pool:
        lifecycle = build_services(Database(pool), clock=clock, rng=random.Random(7)).lifecycle
        ended = await lifecycle.end_undeliverable()
        assert sorted(ended) == sorted([leased, deep_scope, deep_parameters])
        assert await lifecycle.end_undeliverable() == []  # once only

    assert listed(database_url) == set()
    assert {task: state(database_url, task) for task in (leased, deep_scope, deep_parameters, at_the_limit,
                                                         done, ordinary)} == {
        leased: "cancelling", deep_scope: "cancelled", deep_parameters: "cancelled", at_the_limit: "pending",
        done: "cancelled", ordinary: "pending"}
    async with await connect(database_url) as conn:
        for task in (deep_scope, deep_parameters):
            last = (await read_stream(conn, task))[-1]
            assert isinstance(last, TaskCancelled) and last.reason == UNDELIVERABLE
            assert last.actor == "gateway"
        stop = (await read_stream(conn, leased))[-1]
        assert isinstance(stop, CancelRequested) and stop.reason == UNDELIVERABLE
    await assert_log_rebuilds_live(database_url)


async def test_a_second_process_finds_the_list_emptied(world: World, database_url: str, clock: ManualClock,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Two Gateways starting at once end each listed task once between them."""
    monkeypatch.setattr("leasehold.domain.task.check_field", lambda *args, **kwargs: None)
    monkeypatch.setattr("leasehold.domain.scopes.check_field", lambda *args, **kwargs: None)
    tasks = {await world.task(scope=nested(40)) for _ in range(6)}
    monkeypatch.undo()
    await world.services.db.pool.close()
    migrate.downgrade(database_url, "0021")
    migrate.upgrade(database_url, "head")
    assert listed(database_url) == tasks


    async with create_pool(database_url, min_size=1, max_size=8) as pool:
        lifecycles = [build_services(Database(pool), clock=clock).lifecycle for _ in range(2)]
        first, second = await asyncio.gather(*(lc.end_undeliverable() for lc in lifecycles))
    assert sorted([*first, *second]) == sorted(tasks)
    assert all(state(database_url, task) == "cancelled" for task in tasks)
    await assert_log_rebuilds_live(database_url)


async def test_a_gateway_cancels_the_listed_tasks_before_it_serves(
        world: World, database_url: str, pki: PkiPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("leasehold.domain.task.check_field", lambda *args, **kwargs: None)
    monkeypatch.setattr("leasehold.domain.scopes.check_field", lambda *args, **kwargs: None)
    stored = await world.task(scope=nested(252))
    monkeypatch.undo()
    await world.services.db.pool.close()
    with psycopg.connect(database_url) as conn:
        conn.execute(revision_module("0022_undeliverable_tasks.py").LIST)
    assert listed(database_url) == {stored}
    async with running_gateway(database_url, pki):
        # Startup is over: the task ended before the first request could be served.
        assert state(database_url, stored) == "cancelled"
        assert listed(database_url) == set()
    await assert_log_rebuilds_live(database_url)
