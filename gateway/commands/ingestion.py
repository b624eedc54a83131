"""Centralized ingestion of accepted result batches: assets, threats, detections, files,
exposure changes and raw outputs (see the README, "Scans: profiles, orchestration, ingestion")."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from psycopg import AsyncCursor

from domain.task import TaskState
from persistence.queries import QUERIES


async def ingest_batch(cur: AsyncCursor[Any], task: TaskState, batch_id: UUID, records: list[Any],
                       now: datetime) -> None:
    """Persist a newly accepted batch's records into the ingestion tables.

    Not a projection: it reads the payload, which events only name by sha256. It runs in the
    acceptance transaction, and every statement is idempotent for (batch_id, record index) —
    assets by (organisation, kind, value), threats by external id (or, without one, by batch and
    index), detections by (threat, scan job) — so running it twice for one batch adds nothing.
    ``replay rebuild`` does not rebuild these tables.
    """
    base = {"organization_id": task.organization_id, "scan_id": task.scan_id, "scan_job_id": task.scan_job_id,
            "batch_id": batch_id, "now": now}
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            continue
        kind = record.get("type")
        params = {**base, "record_index": index, "data": record}
        if kind == "asset":
            if record.get("kind") is None or record.get("value") is None:
                continue
            attributes = record.get("attributes")
            await cur.execute(QUERIES["ingest_asset"], {
                **base, "id": uuid4(), "kind": str(record["kind"]), "value": str(record["value"]),
                "attributes": attributes if isinstance(attributes, dict) else {}})
        elif kind == "threat":
            external_id = str(record.get("external_id") or "")
            threat = {**params, "id": uuid4(), "external_id": external_id,
                      "title": str(record.get("title") or ""), "severity": str(record.get("severity") or "")}
            # Read on a cursor of its own: cur may still have an earlier record's write queued
            # (see persistence.writes.BufferedCursor).
            async with cur.connection.cursor() as threat_cur:
                await threat_cur.execute(
                    QUERIES["ingest_threat_external" if external_id else "ingest_threat_anonymous"], threat)
                row = await threat_cur.fetchone()
            assert row is not None, "the upsert returns the threat"
            threat_id = row[0]
            await cur.execute(QUERIES["ingest_detection"], {**base, "threat_id": threat_id})
        elif kind == "file":
            await cur.execute(QUERIES["ingest_file_record"], params)
        elif kind in ("exposure", "exposure_change"):  # the plugin protocol says "exposure"
            await cur.execute(QUERIES["ingest_exposure_change"], params)
        elif kind in ("raw", "raw_output"):  # the plugin protocol says "raw"
            await cur.execute(QUERIES["ingest_raw_output"], params)
