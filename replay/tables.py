""":class:`projections.memory.MemoryTables` with a faster primary-key function.

The shared class computes every row's key with a generator expression over the table's key
columns, which is a third of a rebuild's time. This subclass precomputes one key function per
table and changes nothing else: same row changes, same semantics, equal results (checked in
``tests/replay``). Moving ``_key`` into ``projections/memory.py`` would give every user the gain.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

from projections.memory import MemoryTables
from projections.rows import PRIMARY_KEYS, Row


def _key_function(columns: tuple[str, ...]) -> Callable[[Row], tuple[Any, ...]]:
    if len(columns) == 1:
        (column,) = columns
        return lambda row: (row[column],)
    return itemgetter(*columns)  # a tuple for two or more columns


class FastMemoryTables(MemoryTables):
    """MemoryTables whose key lookup is one precomputed call per row."""

    _KEYS: dict[str, Callable[[Row], tuple[Any, ...]]] = {
        table: _key_function(columns) for table, columns in PRIMARY_KEYS.items()}

    def _key(self, table: str, row: Row) -> tuple[Any, ...]:
        return self._KEYS[table](row)
