"""Centralized ingestion of accepted result batches: assets, threats, detections, files,
exposure changes and raw outputs (see docs/guides/operate/scans.md, "What the results become")."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from leasehold.domain.task import TaskState
from leasehold.persistence.transaction import Transaction

#: Record types kept whole, one row per (batch, record index), and the statement that stores them.
_KEYED = {"file": "ingest_file_records", "exposure": "ingest_exposure_changes",
          "exposure_change": "ingest_exposure_changes", "raw": "ingest_raw_outputs",
          "raw_output": "ingest_raw_outputs"}  # the plugin protocol says "exposure" and "raw"


async def ingest_batch(tx: Transaction, task: TaskState, batch_id: UUID, records: list[Any],
                       now: datetime) -> None:
    """Persist a newly accepted batch's records into the ingestion tables.

    Not a projection: it reads the payload, which events only name by sha256. It runs in the
    acceptance transaction, and every statement is idempotent for (batch_id, record index) —
    assets by (organisation, kind, value), threats by external id (or, without one, by batch and
    index), detections by (threat, scan job) — so running it twice for one batch adds nothing.
    ``replay rebuild`` does not rebuild these tables.

    Assets travel as one statement for the whole batch (one asset reported twice in a batch is
    merged first, in order: an upsert may not touch one row twice in a statement), and so do the
    kept-whole records of each type; threats, which need their row's id for the detection, one
    by one.
    """
    base = {"organization_id": task.organization_id, "scan_id": task.scan_id, "scan_job_id": task.scan_job_id,
            "batch_id": batch_id, "now": now}
    assets: dict[tuple[str, str], dict[str, Any]] = {}
    kept: dict[str, tuple[list[int], list[Any]]] = {}
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            continue
        kind = record.get("type")
        if kind == "asset":
            if record.get("kind") is None or record.get("value") is None:
                continue
            attributes = record.get("attributes")
            merged = assets.setdefault((str(record["kind"]), str(record["value"])), {})
            merged.update(attributes if isinstance(attributes, dict) else {})
        elif kind == "threat":
            external_id = str(record.get("external_id") or "")
            threat = {**base, "record_index": index, "data": record, "id": uuid4(), "external_id": external_id,
                      "title": str(record.get("title") or ""), "severity": str(record.get("severity") or "")}
            threat_id = (await tx.value(
                "ingest_threat_external" if external_id else "ingest_threat_anonymous", threat)).id
            await tx.execute("ingest_detection", {**base, "threat_id": threat_id})
        elif (statement := _KEYED.get(str(kind))) is not None:
            indexes, data = kept.setdefault(statement, ([], []))
            indexes.append(index)
            data.append(record)
    if assets:
        await tx.execute("ingest_assets", {
            **base, "ids": [uuid4() for _ in assets], "kinds": [k for k, _ in assets],
            "values": [v for _, v in assets], "attributes": list(assets.values())})
    for statement, (indexes, data) in kept.items():
        await tx.execute(statement, {**base, "record_indexes": indexes, "records": data})
