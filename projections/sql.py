"""Applies row changes to PostgreSQL inside the caller's transaction (the live path).

Statements are composed with ``psycopg.sql`` from the fixed table and column names of the
projector (never from input) and cached per shape, so psycopg can prepare them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import AsyncCursor, sql

from projections.rows import Insert, RowOp, Upsert

_cache: dict[tuple[Any, ...], sql.Composed] = {}


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


async def apply(cur: AsyncCursor[Any], ops: Iterable[RowOp]) -> None:
    """Execute ``ops`` in order on ``cur`` (pipeline them by opening ``conn.pipeline()`` first)."""
    for op in ops:
        query, params = render(op)
        await cur.execute(query, params)
