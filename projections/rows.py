"""Row changes: what a projector says an event does to the read models.

Projectors return these plain values instead of running SQL, so the same projector serves two
interpreters: :mod:`persistence.writes` (live writes, inside the command's transaction) and
:mod:`projections.memory` (replay rebuilds, folded in memory then bulk-copied).
Values are absolute (never "increment"), so applying a change is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Insert:
    table: str
    row: Row


@dataclass(frozen=True, slots=True)
class Upsert:
    """Insert, or overwrite the non-key columns of the row with the same ``key`` columns."""

    table: str
    key: tuple[str, ...]
    row: Row


@dataclass(frozen=True, slots=True)
class Update:
    """Set ``values`` on the row identified by ``key`` when every ``guard`` column holds one of
    its allowed values (``None`` stands for SQL NULL)."""

    table: str
    key: Row
    values: Row
    guard: tuple[tuple[str, tuple[Any, ...]], ...] = ()


RowOp = Insert | Upsert | Update

# Primary keys of every projected table, for the in-memory interpreter and for verification.
PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    "organizations": ("id",),
    "workers": ("id",),
    "organization_workers": ("organization_id", "worker_id"),
    "stored_profiles": ("id",),
    "scans": ("id",),
    "scan_jobs": ("id",),
    "worker_tasks": ("id",),
    "worker_task_attempts": ("id",),
    "worker_result_batches": ("id",),
    "scheduled_scans": ("id",),
}

# Insertion order that satisfies foreign keys when projections are bulk-loaded.
TABLE_ORDER: tuple[str, ...] = tuple(PRIMARY_KEYS)
