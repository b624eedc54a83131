"""Centralized ingestion in the batch acceptance transaction is retry-safe: a batch
delivered twice, or a whole scan's batches replayed, never adds rows."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson

from leasehold.domain.errors import LeaseholdError
from leasehold.domain.events import ProfileStep
from leasehold.domain.results import payload_sha256
from leasehold.gateway.commands.ingestion import ingest_batch
from leasehold.persistence.task_rows import task_from_row
from support.core import World

TABLES = ("assets", "asset_sightings", "threats", "threat_detections", "file_records", "exposure_changes",
          "raw_outputs")

RECORDS: list[Any] = [
    {"type": "asset", "kind": "host", "value": "10.0.0.1", "attributes": {"os": "linux"}},
    {"type": "asset", "kind": "host", "value": "10.0.0.1"},
    {"type": "threat", "external_id": "CVE-2030-1", "title": "bad", "severity": "high"},
    {"type": "threat", "external_id": "", "title": "anonymous finding"},
    {"type": "file", "path": "/etc/passwd", "sha256": "00" * 32},
    {"type": "exposure_change", "asset": "10.0.0.1", "port": 22, "change": "opened"},
    {"type": "raw_output", "text": "nmap says hi"},
    # The plugin protocol's own names for the last two (what the built-in plugins write).
    {"type": "exposure", "asset": {"kind": "service", "value": "10.0.0.1:22/tcp"}, "change": "opened"},
    {"type": "raw", "text": "tls handshake failed"},
    "not a record",
]


async def _counts(world: World) -> dict[str, int]:
    async with world.pool.connection() as conn:
        out = {}
        for table in TABLES:
            cur = await conn.execute(f"SELECT count(*) FROM {table}")  # noqa: S608 - fixed names
            row = await cur.fetchone()
            assert row is not None
            out[table] = row[0]
        return out


async def _submit(world: World, worker: Any, a: Any, records: list[Any], key: str, seq: int,
                  final: bool) -> Any:
    return await world.lifecycle.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token,
                                              sequence_number=seq, idempotency_key=key,
                                              payload_sha256=payload_sha256(records), records=records,
                                              final=final)


async def test_batches_delivered_twice_and_replayed_ingest_once(world: World) -> None:
    worker = await world.worker(task_types=("discover", "vulnscan"))
    scan = await world.scans.create_scan(world.org, {"targets": ["10.0.0.0/30"]}, profile=(
        ProfileStep(task_type="discover"), ProfileStep(task_type="vulnscan")))
    delivered: list[tuple[Any, list[Any], str, int, bool]] = []
    for step in range(2):
        a = await world.lifecycle.acquire(worker)
        assert a is not None
        await world.lifecycle.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
        batches = [(RECORDS[:4], f"s{step}-1", 1, False), (RECORDS[4:], f"s{step}-2", 2, True)]
        for records, key, seq, final in batches:
            first = await _submit(world, worker, a, records, key, seq, final)
            again = await _submit(world, worker, a, records, key, seq, final)  # same key: a retry
            assert not first.duplicate and again.duplicate
            delivered.append((a, records, key, seq, final))
        if step == 0:
            after_first_task = await _counts(world)
        await world.lifecycle.complete(worker, a.task.id, a.attempt.id, a.lease_token)

    counts = await _counts(world)
    assert after_first_task == {"assets": 1, "asset_sightings": 1, "threats": 2, "threat_detections": 2,
                                "file_records": 1, "exposure_changes": 2, "raw_outputs": 2}
    # The second task: same asset and external threat (upserted), its own detections and rows.
    assert counts == {"assets": 1, "asset_sightings": 2, "threats": 3, "threat_detections": 4,
                      "file_records": 2, "exposure_changes": 4, "raw_outputs": 4}
    async with world.pool.connection() as conn:
        cur = await conn.execute("SELECT attributes FROM assets")
        assert await cur.fetchall() == [({"os": "linux"},)]

    # Replay the whole scan's batches: resubmitting each one is a duplicate (the tasks are over,
    # so they are refused or acknowledged, but never ingested again)...
    for a, records, key, seq, final in delivered:
        with contextlib.suppress(LeaseholdError):  # a finished task may refuse it: counts matter
            ack = await _submit(world, worker, a, records, key, seq, final)
            assert ack.duplicate
    assert await _counts(world) == counts
    # ...and running ingestion itself again for every accepted batch adds nothing either.
    async with world.pool.connection() as conn:
        cur = await conn.execute("SELECT b.id, b.task_id, p.body FROM worker_result_batches b"
                                 " JOIN result_payloads p ON p.sha256 = b.payload_sha256"
                                 " JOIN worker_tasks t ON t.id = b.task_id WHERE t.scan_id = %s", (scan,))
        batches = await cur.fetchall()
    assert len(batches) == 4
    async with world.services.db.transaction() as tx:
        for batch_id, task_id, body in batches:
            task, _ = task_from_row(await tx.one("task_read", {"task_id": task_id, "now": None}))
            await ingest_batch(tx, task, batch_id, orjson.loads(body), world.clock())
        await tx.commit()
    assert await _counts(world) == counts
