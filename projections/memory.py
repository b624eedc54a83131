"""Applies row changes to in-memory tables (the rebuild path of ``replay``).

Same row changes as the live path, folded into dictionaries keyed by primary key, so a whole
log can be projected quickly and then bulk-loaded or compared with the live tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from projections.rows import PRIMARY_KEYS, Insert, Row, RowOp, Update, Upsert


class ProjectionError(Exception):
    """The log asks for a row change that cannot apply (a sign of a broken or tampered log)."""


class MemoryTables:
    """Projected tables as ``{table: {primary key tuple: row}}``."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[tuple[Any, ...], Row]] = {t: {} for t in PRIMARY_KEYS}

    def _key(self, table: str, row: Row) -> tuple[Any, ...]:
        return tuple(row[k] for k in PRIMARY_KEYS[table])

    def apply(self, ops: Iterable[RowOp]) -> None:
        for op in ops:
            rows = self.tables[op.table]
            if isinstance(op, Insert):
                key = self._key(op.table, op.row)
                if key in rows:
                    raise ProjectionError(f"duplicate {op.table} row {key}")
                rows[key] = dict(op.row)
            elif isinstance(op, Upsert):
                key = self._key(op.table, op.row)
                existing = rows.get(key)
                if existing is None:
                    rows[key] = dict(op.row)
                else:
                    existing.update((c, v) for c, v in op.row.items() if c not in op.key)
            else:
                self._update(rows, op)

    def _update(self, rows: dict[tuple[Any, ...], Row], op: Update) -> None:
        key = self._key(op.table, op.key)
        row = rows.get(key)
        if row is None:
            # Like SQL: an UPDATE that matches nothing changes nothing. The live path behaves
            # the same; verification then reports the missing row.
            return
        for column, allowed in op.guard:
            if row.get(column) not in allowed:
                return
        row.update(op.values)
