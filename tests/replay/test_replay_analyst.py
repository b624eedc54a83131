"""The analyst role: runs every documented example query, writes nothing, never sees a
lease-token hash (migration 0003)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from replay_support import random_workload

from leasehold import replay
from support.core import World

EXAMPLES = Path(replay.__file__).with_name("analyst_examples.sql")
PROJECTIONS = ("organizations", "workers", "organization_workers", "scans", "scan_jobs", "worker_tasks",
               "worker_task_attempts", "worker_result_batches")
VIEWS = ("analyst_events", "task_wait_times", "attempt_durations", "attempt_failures", "task_type_reliability",
         "worker_reliability", "worker_utilisation_hourly", "cancellation_latency", "throughput_hourly",
         "cancellation_deliveries", "cancellation_latency_by_organization")


def examples() -> dict[str, str]:
    blocks = re.split(r"^-- name: (\w+)\n", EXAMPLES.read_text(), flags=re.M)[1:]
    return {name: body.strip() for name, body in zip(blocks[::2], blocks[1::2], strict=True)}


def as_analyst(url: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        conn.execute("SET ROLE leasehold_analyst")
        return conn.execute(statement).fetchall()  # type: ignore[arg-type]


@pytest.fixture
async def busy(world: World, database_url: str) -> str:
    await random_workload(world, seed=17, rounds=10)
    return database_url


def test_the_examples_cover_every_view() -> None:
    text = EXAMPLES.read_text()
    assert len(examples()) >= 10
    assert all(view in text for view in VIEWS)


async def test_the_analyst_runs_every_documented_example(busy: str) -> None:
    results = {name: as_analyst(busy, query) for name, query in examples().items()}
    empty = {name for name, rows in results.items() if not rows}
    assert empty <= {"oldest_waiting_tasks", "worker_utilisation_last_day"}, empty
    assert all(row[0] != "lease_token_hash" for rows in results.values() for row in rows)


async def test_the_analyst_reads_projections_but_no_lease_token_hash(busy: str) -> None:
    for table in PROJECTIONS:
        if table != "worker_task_attempts":
            assert as_analyst(busy, f"SELECT count(*) FROM {table}")[0][0] > 0  # noqa: S608
    assert as_analyst(busy, "SELECT count(id), count(error) FROM worker_task_attempts")[0][0] > 0
    for statement in ("SELECT lease_token_hash FROM worker_task_attempts", "SELECT * FROM worker_task_attempts",
                      "SELECT state FROM events", "SELECT count(*) FROM events", "SELECT body FROM result_payloads",
                      "SELECT key_hash FROM api_keys", "SELECT * FROM checkpoints"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            as_analyst(busy, statement)
    leased = as_analyst(busy, "SELECT data FROM analyst_events WHERE event_type IN ('TaskLeased', 'LeaseReissued')")
    assert leased and all("lease_token_hash" not in data and "attempt_id" in data for (data,) in leased)
    with psycopg.connect(busy) as conn:
        exposed = conn.execute(
            "SELECT table_name FROM information_schema.columns WHERE table_schema = 'public'"
            " AND column_name = 'lease_token_hash' AND table_name = ANY(%s)", (list(VIEWS),)).fetchall()
    assert exposed == []


KEY = {t: "organization_id" if t == "organization_workers" else "id" for t in PROJECTIONS}
WRITES = (
    *(f"UPDATE {t} SET {KEY[t]} = {KEY[t]} WHERE false" for t in PROJECTIONS),  # noqa: S608
    *(f"DELETE FROM {t} WHERE false" for t in PROJECTIONS),  # noqa: S608
    "INSERT INTO organizations (id, name, created_at, updated_at, version, head_hash)"
    " VALUES (gen_random_uuid(), 'x', now(), now(), 1, '\\x00')",
    "INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash)"
    " VALUES (gen_random_uuid(), 1, 't', '\\x00', '\\x00', '\\x00')",
    "INSERT INTO checkpoints (created_at, transaction_xmin, head_count, changed_count, event_count, prev_seal, seal)"
    " VALUES (now(), '1', 0, 0, 0, '\\x00', '\\x00')",
    "INSERT INTO result_payloads (sha256, body) VALUES (repeat('a', 64), '\\x00')",
    "TRUNCATE worker_result_batches",
    "CREATE TABLE mine (x int)",
    "SELECT nextval('events_notification_id_seq')",
)


async def test_the_analyst_cannot_write_anything(database_url: str) -> None:
    for statement in WRITES:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            as_analyst(database_url, statement)
    for view in VIEWS:  # none is updatable; and none is granted for writing either
        with pytest.raises((psycopg.errors.InsufficientPrivilege, psycopg.errors.ObjectNotInPrerequisiteState)):
            as_analyst(database_url, f"DELETE FROM {view}")  # noqa: S608
    with psycopg.connect(database_url) as conn:
        privileges = conn.execute(
            "SELECT DISTINCT privilege_type FROM information_schema.role_table_grants"
            " WHERE grantee = 'leasehold_analyst' AND table_catalog = current_database()").fetchall()
    assert privileges == [("SELECT",)]
