"""JSON depth limits at the service layer: the domain refuses a task's scope or parameters, and a
scan's or schedule's targets, nesting deeper than the field's limit, whichever way they arrive
(the HTTP layer checks request bodies too; ``tests/api/test_input_limits.py`` covers that door).
A refusal names the field and commits nothing; a value at the limit is accepted."""

from __future__ import annotations

from typing import Any

import pytest

from leasehold.domain.events import ProfileStep
from leasehold.domain.limits import MAX_FIELD_DEPTH, TooDeep
from leasehold.gateway.commands.lifecycle import TaskSpec
from support.core import World

TABLES = ("events", "worker_tasks", "scan_jobs", "scans", "scheduled_scans")


def nested(levels: int) -> dict[str, Any]:
    """A JSON object nesting ``levels`` deep (``{"a": {"a": … {}}}``)."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


async def committed(pool: Any) -> dict[str, int]:
    async with pool.connection() as conn:
        counts = {}
        for table in TABLES:
            cur = await conn.execute(f"SELECT count(*) FROM {table}")  # noqa: S608
            row = await cur.fetchone()
            assert row is not None
            counts[table] = int(row[0])
        return counts


@pytest.mark.parametrize("levels", [MAX_FIELD_DEPTH + 1, 300])
@pytest.mark.parametrize("field", ["scope", "parameters"])
async def test_a_task_field_nesting_too_deep_is_refused_by_the_service_and_commits_nothing(
        world: World, pool: Any, field: str, levels: int) -> None:
    before = await committed(pool)
    with pytest.raises(TooDeep) as refused:
        await world.lifecycle.create_task(world.scan, TaskSpec(task_type="probe", **{field: nested(levels)}))
    assert refused.value.details == {"field": field, "max_depth": MAX_FIELD_DEPTH}
    assert await committed(pool) == before


@pytest.mark.parametrize("field", ["scope", "parameters"])
async def test_a_task_field_at_the_depth_limit_is_created(world: World, field: str) -> None:
    task = await world.lifecycle.create_task(world.scan, TaskSpec(task_type="probe",
                                                                  **{field: nested(MAX_FIELD_DEPTH)}))
    assert getattr(task, field) == nested(MAX_FIELD_DEPTH)


async def test_scan_and_schedule_targets_nesting_too_deep_are_refused_and_commit_nothing(
        world: World, pool: Any) -> None:
    before = await committed(pool)
    targets = {"targets": ["127.0.0.1"], "extra": nested(MAX_FIELD_DEPTH)}  # one level more with the outer object
    with pytest.raises(TooDeep) as scan:
        await world.scans.create_scan(world.org, targets)
    with pytest.raises(TooDeep) as schedule:
        await world.services.schedules.create(world.org, name="nightly", targets=targets,
                                              profile=(ProfileStep(task_type="probe"),), interval_seconds=3600)
    assert scan.value.details["field"] == schedule.value.details["field"] == "targets"
    assert await committed(pool) == before
