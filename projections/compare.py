"""Compare two sets of projected tables row by row (``replay verify`` and the rebuild tests).

Pure: both sides are :data:`projections.memory.Tables`, one read from the database, one folded
from the log. Both must come from one snapshot (``REPEATABLE READ``), else a command committing
in between shows up as a false difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from leasehold.projections.memory import Tables
from leasehold.projections.rows import PRIMARY_KEYS, Row


@dataclass(frozen=True, slots=True)
class Difference:
    """One row that differs: missing on one side, or columns with different values."""

    table: str
    key: tuple[Any, ...]
    kind: str  # "missing_live", "missing_rebuilt", "changed"
    columns: dict[str, tuple[Any, Any]]

    def __str__(self) -> str:
        key = ", ".join(str(k) for k in self.key)
        if self.kind != "changed":
            return f"{self.table}[{key}]: {self.kind.replace('_', ' ')}"
        cols = "; ".join(f"{c}: live={a!r} rebuilt={b!r}" for c, (a, b) in self.columns.items())
        return f"{self.table}[{key}]: {cols}"


def diff(live: Tables, rebuilt: Tables) -> list[Difference]:
    """Every row-level difference between live and rebuilt projections: table by table (in
    :data:`~projections.rows.PRIMARY_KEYS` order), keys in ``repr`` order."""
    comparison = Comparison()
    comparison.add(live, rebuilt)
    return comparison.differences()


class Comparison:
    """Differences accumulated part by part (the bounded ``replay verify`` compares one range of
    stream groups at a time, in several processes), then merged and ordered as :func:`diff` orders
    them.

    Whole rows are compared with ``==`` first (in C): rows equal that way cannot differ column
    by column, so only the unequal ones and the keys on one side only are looked at closely.
    A row found on one side only is held until the end: the other side may have it in another
    part (a live row whose group column was edited), and then it is one changed row.
    """

    __slots__ = ("changed", "only_live", "only_rebuilt")

    def __init__(self) -> None:
        self.changed: list[Difference] = []
        self.only_live: dict[tuple[str, tuple[Any, ...]], Row] = {}
        self.only_rebuilt: dict[tuple[str, tuple[Any, ...]], Row] = {}

    def add(self, live: Tables, rebuilt: Tables) -> None:
        for table in PRIMARY_KEYS:
            a, b = live.get(table, {}), rebuilt.get(table, {})
            matched = 0
            for key, row in a.items():
                other = b.get(key)
                if other is None:
                    self.only_live[table, key] = row
                    continue
                matched += 1
                if other != row and (found := row_difference(table, key, row, other)) is not None:
                    self.changed.append(found)
            if matched < len(b):  # some key is on the rebuilt side only
                for key in b.keys() - a.keys():
                    self.only_rebuilt[table, key] = b[key]

    def merge(self, other: Comparison) -> None:
        self.changed.extend(other.changed)
        self.only_live.update(other.only_live)
        self.only_rebuilt.update(other.only_rebuilt)

    def differences(self) -> list[Difference]:
        out = list(self.changed)
        for (table, key), row in self.only_live.items():
            other = self.only_rebuilt.get((table, key))
            if other is None:
                out.append(Difference(table, key, "missing_rebuilt", {}))
            elif (found := row_difference(table, key, row, other)) is not None:
                out.append(found)
        out.extend(Difference(table, key, "missing_live", {}) for table, key in self.only_rebuilt
                   if (table, key) not in self.only_live)
        order = {table: n for n, table in enumerate(PRIMARY_KEYS)}
        return sorted(out, key=lambda d: (order[d.table], repr(d.key)))


def row_difference(table: str, key: tuple[Any, ...], live: Row, rebuilt: Row) -> Difference | None:
    """The columns in which two versions of one row differ (None: none does, once normalised)."""
    changed = {c: (live.get(c), rebuilt.get(c)) for c in live.keys() | rebuilt.keys()
               if _normal(live.get(c)) != _normal(rebuilt.get(c))}
    return Difference(table, key, "changed", changed) if changed else None


def _normal(value: Any) -> Any:
    """The same value whatever container or buffer type carried it (a tuple rebuilt, a list read)."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, memoryview):
        return bytes(value)
    return value
