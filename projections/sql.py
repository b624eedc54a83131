"""Applies row changes to PostgreSQL inside the caller's transaction (the live path).

Statements are composed with ``psycopg.sql`` from the fixed table and column names of the
projector (never from input) and cached per shape, so psycopg can prepare them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import AsyncCursor, sql

from projections.rows import PRIMARY_KEYS, Insert, RowOp, Update, Upsert

_cache: dict[tuple[Any, ...], sql.Composed] = {}
_text: dict[tuple[Any, ...], bytes] = {}


def _columns(names: Iterable[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def render(op: RowOp) -> tuple[sql.Composed, list[Any]]:
    """The statement and parameters that carry out ``op``."""
    if isinstance(op, Insert | Upsert):
        cols = tuple(op.row)
        shape: tuple[Any, ...] = (type(op).__name__, op.table, cols, getattr(op, "key", None))
        query = _cache.get(shape)
        if query is None:
            query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                sql.Identifier(op.table), _columns(cols), sql.SQL(", ").join(sql.Placeholder() * len(cols)))
            if isinstance(op, Upsert):
                rest = [c for c in cols if c not in op.key]
                query += sql.SQL(" ON CONFLICT ({}) DO UPDATE SET {}").format(
                    _columns(op.key),
                    sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in rest))
            _cache[shape] = query
        return query, list(op.row.values())
    keys, cols = tuple(op.key), tuple(op.values)
    guards = tuple((name, allowed == (None,)) for name, allowed in op.guard)
    shape = ("Update", op.table, keys, cols, guards)
    query = _cache.get(shape)
    if query is None:
        where = [sql.SQL("{} = %s").format(sql.Identifier(k)) for k in keys]
        for name, is_null in guards:
            where.append(sql.SQL("{} IS NULL" if is_null else "{} = ANY(%s)").format(sql.Identifier(name)))
        query = sql.SQL("UPDATE {} SET {} WHERE {}").format(
            sql.Identifier(op.table),
            sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in cols),
            sql.SQL(" AND ").join(where))
        _cache[shape] = query
    params = [*op.values.values(), *op.key.values()]
    params += [list(allowed) for allowed in (a for _, a in op.guard) if allowed != (None,)]
    return query, params


def coalesce(ops: Iterable[RowOp]) -> list[RowOp]:
    """Fold unguarded updates into an earlier write of the same row: fewer statements, same result.

    A guarded update depends on the row's current values, so it ends folding for its row; later
    changes to that row start afresh after it.
    """
    out: list[RowOp] = []
    open_rows: dict[tuple[str, tuple[Any, ...]], int] = {}
    for op in ops:
        if isinstance(op, Update):
            key = (op.table, tuple(op.key.items()))
            if op.guard:
                open_rows.pop(key, None)
                out.append(op)
                continue
            at = open_rows.get(key)
            if at is None:
                open_rows[key] = len(out)
                out.append(op)
                continue
            target = out[at]
            if isinstance(target, Update):
                out[at] = Update(target.table, target.key, {**target.values, **op.values})
            else:
                out[at] = type(target)(**{**_fields(target), "row": {**target.row, **op.values}})
            continue
        pk = tuple((k, op.row[k]) for k in PRIMARY_KEYS[op.table])
        open_rows[(op.table, pk)] = len(out)
        out.append(op)
    return out


def _fields(op: Insert | Upsert) -> dict[str, Any]:
    return {"table": op.table, "row": op.row, **({"key": op.key} if isinstance(op, Upsert) else {})}


async def apply(cur: AsyncCursor[Any], ops: Iterable[RowOp]) -> None:
    """Execute ``ops`` in order on ``cur`` (pipeline them by opening ``conn.pipeline()`` first)."""
    for op in coalesce(ops):
        query, params = render(op)
        shape = id(query)
        text = _text.get((shape,))
        if text is None:
            text = _text[(shape,)] = query.as_bytes(cur)
        await cur.execute(text, params)
