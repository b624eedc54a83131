"""Centralized ingestion of accepted result batches: assets, threats, detections, files,
exposure changes and raw outputs (see the README, "Scans: profiles, orchestration, ingestion")."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from domain.task import TaskState
from persistence.transaction import Transaction


async def ingest_batch(tx: Transaction, task: TaskState, batch_id: UUID, records: list[Any],
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
            await tx.execute("ingest_asset", {
                **base, "id": uuid4(), "kind": str(record["kind"]), "value": str(record["value"]),
                "attributes": attributes if isinstance(attributes, dict) else {}})
        elif kind == "threat":
            external_id = str(record.get("external_id") or "")
            threat = {**params, "id": uuid4(), "external_id": external_id,
                      "title": str(record.get("title") or ""), "severity": str(record.get("severity") or "")}
            (threat_id,) = await tx.value(
                "ingest_threat_external" if external_id else "ingest_threat_anonymous", threat)
            await tx.execute("ingest_detection", {**base, "threat_id": threat_id})
        elif kind == "file":
            await tx.execute("ingest_file_record", params)
        elif kind in ("exposure", "exposure_change"):  # the plugin protocol says "exposure"
            await tx.execute("ingest_exposure_change", params)
        elif kind in ("raw", "raw_output"):  # the plugin protocol says "raw"
            await tx.execute("ingest_raw_output", params)
