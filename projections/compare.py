"""Compare two sets of projected tables row by row (``replay verify`` and the rebuild tests).

Pure: both sides are :data:`projections.memory.Tables`, one read from the database, one folded
from the log. Both must come from one snapshot (``REPEATABLE READ``), else a command committing
in between shows up as a false difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from projections.memory import Tables
from projections.rows import PRIMARY_KEYS


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
    :data:`~projections.rows.PRIMARY_KEYS` order), keys in ``repr`` order.

    Whole rows are compared with ``==`` first (in C): rows equal that way cannot differ column
    by column, so only the unequal ones and the keys on one side only are looked at closely.
    On a log of 1M events that is most of ``replay verify``'s time saved.
    """
    out: list[Difference] = []
    for table in PRIMARY_KEYS:
        a, b = live.get(table, {}), rebuilt.get(table, {})
        suspects = {k for k, row in a.items() if b.get(k) != row}
        suspects.update(b.keys() - a.keys())
        for key in sorted(suspects, key=repr):
            if key not in b:
                out.append(Difference(table, key, "missing_rebuilt", {}))
            elif key not in a:
                out.append(Difference(table, key, "missing_live", {}))
            else:
                changed = {c: (a[key].get(c), b[key].get(c)) for c in a[key].keys() | b[key].keys()
                           if _normal(a[key].get(c)) != _normal(b[key].get(c))}
                if changed:
                    out.append(Difference(table, key, "changed", changed))
    return out


def _normal(value: Any) -> Any:
    """The same value whatever container or buffer type carried it (a tuple rebuilt, a list read)."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, memoryview):
        return bytes(value)
    return value
