"""A command's writes, combined into as few statements as possible (the live write path).

Statements are composed with ``psycopg.sql`` from the fixed table and column names of the
projector (never from input) and cached per shape, so psycopg can prepare them.

Writes are not sent one statement each. A :class:`WriteBuffer` collects them — events, row
changes, other data-modifying statements, ``pg_notify`` calls — and sends each run of them as
one statement of data-modifying CTEs::

    WITH w0 AS (INSERT INTO events …), w1 AS (UPDATE worker_tasks …), … SELECT pg_notify(%s, %s)

Each :class:`persistence.transaction.Transaction` owns one buffer and sends it before any other
statement it runs (a read, a savepoint, COMMIT): a read sees every earlier write of its
transaction, and nothing is left unsent.

The sub-statements of one statement share a snapshot, cannot see each other's effects and run
in no specified order, so a write starts a new statement (still in the same pipeline, in order)
when the current one already writes its table (one row written twice, or unique checks that
would run in another order). Events are the exception: all the events of a statement are rows of
its one ``INSERT INTO events``, in order, so ``notification_id`` follows the order of the appends.
Checks that read another table run after the statement, where they see all of it: foreign keys
at its end, and the two triggers that compare execution modes across tables at COMMIT (they are
deferred constraint triggers, migration 0008); a row trigger reading another table would see
none of its sibling sub-statements' rows, so none may exist (``tests/core/test_write_buffer.py``
fails when one appears).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from psycopg import AsyncCursor, sql

from leasehold.projections.rows import PRIMARY_KEYS, Insert, RowOp, Update, Upsert

_cache: dict[tuple[Any, ...], sql.Composed] = {}

def _columns(names: Iterable[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def render(op: RowOp) -> tuple[sql.Composed, list[Any]]:
    """The statement and parameters that carry out ``op``."""
    _, query, params = _render(op)
    return query, params


def _render(op: RowOp) -> tuple[tuple[Any, ...], sql.Composed, list[Any]]:
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
        return shape, query, list(op.row.values())
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
    return shape, query, params


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


# --- the write buffer ------------------------------------------------------------------------

_EVENT_COLUMNS = ("originator_id", "originator_version", "topic", "state", "prev_hash", "hash")
_events_cache: dict[int, sql.Composed] = {}
_statement_text: dict[tuple[Any, ...], bytes] = {}
_positional: dict[str, tuple[sql.SQL, tuple[str, ...]]] = {}
_NAMED = re.compile(r"%\((\w+)\)([sb])")


def _insert_events(count: int) -> sql.Composed:
    """``INSERT INTO events … VALUES (…), (…)`` for ``count`` events (scalar parameters: cheaper to
    adapt than arrays for the few events a statement carries)."""
    query = _events_cache.get(count)
    if query is None:
        row = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() * len(_EVENT_COLUMNS)))
        query = _events_cache[count] = sql.SQL("INSERT INTO events ({}) VALUES {}").format(
            _columns(_EVENT_COLUMNS), sql.SQL(", ").join([row] * count))
    return query


class _Statement:
    """One statement being assembled: its events, its data-modifying parts, its notifications."""

    __slots__ = ("event_count", "event_params", "parts", "notifies", "tables")

    def __init__(self) -> None:
        self.event_count = 0
        self.event_params: list[Any] = []
        self.parts: list[tuple[tuple[Any, ...], sql.Composable, Sequence[Any]]] = []
        self.notifies: list[Any] = []
        self.tables: set[str] = set()

    def admits(self, table: str) -> bool:
        """Whether a write to ``table`` may join (it is not written by this statement yet)."""
        return table not in self.tables

    def shape(self) -> tuple[Any, ...]:
        return (self.event_count, tuple(shape for shape, _, _ in self.parts), len(self.notifies))

    def compose(self) -> sql.Composable:
        ctes: list[sql.Composable] = [_insert_events(self.event_count)] if self.event_count else []
        ctes += [query for _, query, _ in self.parts]
        notifies = len(self.notifies) // 2
        if len(ctes) == 1 and not notifies:
            (only,) = ctes
            return only
        select = sql.SQL("SELECT {}").format(
            sql.SQL(", ").join([sql.SQL("pg_notify(%s, %s)")] * notifies) if notifies else sql.SQL("1"))
        if not ctes:
            return select
        return sql.SQL("WITH {} {}").format(
            sql.SQL(", ").join(sql.SQL("{} AS ({})").format(sql.Identifier(f"w{i}"), query)
                               for i, query in enumerate(ctes)),
            select)

    def params(self) -> list[Any]:
        out = list(self.event_params)
        for _, _, params in self.parts:
            out += params
        out += self.notifies
        return out


class WriteBuffer:
    """Writes waiting to be sent, already split into the statements that will carry them."""

    __slots__ = ("_statements",)

    def __init__(self) -> None:
        self._statements: list[_Statement] = []

    def __bool__(self) -> bool:
        return bool(self._statements)

    def __len__(self) -> int:
        """How many statements the queued writes will take."""
        return len(self._statements)

    def _current(self) -> _Statement:
        if not self._statements:
            self._statements.append(_Statement())
        return self._statements[-1]  # not a row: the statement being built

    def _for(self, table: str) -> _Statement:
        statement = self._current()
        if not statement.admits(table):
            statement = _Statement()
            self._statements.append(statement)
        statement.tables.add(table)
        return statement

    def events(self, rows: Iterable[Sequence[Any]]) -> None:
        """Queue event rows (``originator_id, originator_version, topic, state, prev_hash, hash``)."""
        statement = self._current()
        for row in rows:
            statement.event_params += row
            statement.event_count += 1

    def ops(self, ops: Iterable[RowOp]) -> None:
        """Queue row changes (folded by :func:`coalesce` first)."""
        for op in coalesce(ops):
            shape, query, params = _render(op)
            self._for(op.table).parts.append((shape, query, params))

    def statement(self, table: str, query: str, params: dict[str, Any]) -> None:
        """Queue a data-modifying statement on ``table`` with named parameters (``%(name)s``, or
        ``%(name)b`` for one sent in binary: a bytea array as text would be twice its size in hex)
        that may run as a CTE (no ``WITH`` of its own, no result anyone reads)."""
        found = _positional.get(query)
        if found is None:
            names = tuple(name for name, _ in _NAMED.findall(query))
            found = _positional[query] = (sql.SQL(_NAMED.sub(r"%\2", query)), names)
        text, names = found
        self._for(table).parts.append((("statement", query), text, [params[n] for n in names]))

    def notify(self, channel: str, payload: str) -> None:
        """Queue ``pg_notify(channel, payload)`` (delivered at commit, like any NOTIFY)."""
        self._current().notifies += (channel, payload)

    def clear(self) -> None:
        self._statements.clear()

    async def flush(self, cur: AsyncCursor[Any]) -> None:
        """Send the queued writes on ``cur``, a cursor nobody reads from (in a pipeline they
        need no round trip of their own)."""
        statements, self._statements = self._statements, []
        for statement in statements:
            shape = statement.shape()
            text = _statement_text.get(shape)
            if text is None:
                text = _statement_text[shape] = statement.compose().as_bytes(cur)
            await cur.execute(text, statement.params())
