"""Rebuild every projection from the event log, and compare projections row by row.

Used by ``replay rebuild``/``replay verify`` and by the tests that prove invariant 1
("projections are a pure function of the log"). Both sides must be read in one snapshot
(``REPEATABLE READ``) so in-flight transactions cannot cause false differences.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from eventsourcing.persistence import StoredEvent
from psycopg import AsyncConnection, sql

from persistence.codec import MAPPER
from projections.memory import MemoryTables
from projections.projector import project
from projections.rows import PRIMARY_KEYS, Row

Tables = dict[str, dict[tuple[Any, ...], Row]]


async def stored_events(conn: AsyncConnection[Any], *, batch_size: int = 5000
                        ) -> AsyncIterator[tuple[StoredEvent, bytes]]:
    """Every stored event with its chain hash, in ``notification_id`` order, read in batches."""
    last = 0
    while True:
        cur = await conn.execute(
            "SELECT notification_id, originator_id, originator_version, topic, state, hash FROM events"
            " WHERE notification_id > %s ORDER BY notification_id LIMIT %s", (last, batch_size))
        rows = await cur.fetchall()
        if not rows:
            return
        for _nid, oid, version, topic, state, h in rows:
            yield StoredEvent(originator_id=oid, originator_version=version, topic=topic,
                              state=bytes(state)), bytes(h)
        last = rows[-1][0]


async def fold_log(conn: AsyncConnection[Any], *, batch_size: int = 5000,
                   progress: Callable[[int], None] | None = None) -> MemoryTables:
    """Project the whole log into memory with the live projector."""
    tables = MemoryTables()
    count = 0
    async for stored, h in stored_events(conn, batch_size=batch_size):
        tables.apply(project(MAPPER.to_domain_event(stored), h))
        count += 1
        if progress is not None and count % batch_size == 0:
            progress(count)
    return tables


async def load_live(conn: AsyncConnection[Any], schema: str = "public") -> Tables:
    """The live projection tables as ``{table: {primary key: row}}``."""
    live: Tables = {}
    for table, keys in PRIMARY_KEYS.items():
        cur = conn.cursor()
        await cur.execute(sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(table)))
        assert cur.description is not None
        names = [c.name for c in cur.description]
        rows = {}
        for values in await cur.fetchall():
            row = {n: (bytes(v) if isinstance(v, memoryview) else v) for n, v in zip(names, values, strict=True)}
            rows[tuple(row[k] for k in keys)] = row
        live[table] = rows
    return live


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
    """Every row-level difference between live and rebuilt projections."""
    out: list[Difference] = []
    for table in PRIMARY_KEYS:
        a, b = live.get(table, {}), rebuilt.get(table, {})
        for key in sorted(a.keys() | b.keys(), key=repr):
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
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, memoryview):
        return bytes(value)
    return value
