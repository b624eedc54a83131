"""Every named statement's result columns, as PostgreSQL describes them on the migrated schema:
those of a statement with a row class are that class's fields, by name and in order; every
other statement's are names a row can be read by (unique identifiers, no ``?column?``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import pq

from leasehold.persistence.queries import QUERIES
from leasehold.persistence.rows import ROW_TYPES, RowShapeError, field_names, row_factory, typed_row

PARAM = re.compile(r"%\((\w+)\)[sb]")


def _positional(query: str) -> str:
    """The statement with ``%(name)s`` as ``$n`` (one number per name), as the server takes it."""
    numbers: dict[str, int] = {}

    def number(m: re.Match[str]) -> str:
        return f"${numbers.setdefault(m.group(1), len(numbers) + 1)}"

    return PARAM.sub(number, query).replace("%%", "%")


def _describe(database_url: str) -> dict[str, list[str]]:
    """Statement name -> its result columns, from the server's description of the prepared
    statement (nothing runs; parameter types are inferred as when the statement is planned)."""
    out: dict[str, list[str]] = {}
    with psycopg.connect(database_url) as conn:
        for name, query in sorted(QUERIES.items()):
            prepared = conn.pgconn.prepare(name.encode(), _positional(query).encode())
            assert prepared.status == pq.ExecStatus.COMMAND_OK, (name, prepared.error_message)
            description = conn.pgconn.describe_prepared(name.encode())
            out[name] = [description.fname(i).decode() for i in range(description.nfields)]
    return out


def test_every_row_type_names_a_statement() -> None:
    assert set(ROW_TYPES) <= set(QUERIES)
    assert {"task_get", "task_read", "task_read_for_write", "task_lock_for_organization"} <= set(ROW_TYPES)


def test_statement_columns_match_their_rows(database_url: str) -> None:
    described = _describe(database_url)
    assert len(described) == len(QUERIES)
    wrong = {name: (described[name], list(field_names(cls))) for name, cls in ROW_TYPES.items()
             if described[name] != list(field_names(cls))}
    assert wrong == {}, "statement columns (left) differ from their row class's fields (right)"
    unnamed = {name: columns for name, columns in described.items()
               if not all(c.isidentifier() for c in columns) or len(set(columns)) != len(columns)}
    assert unnamed == {}, "every column needs a name of its own (AS ...) to be read by"


@dataclass(frozen=True, slots=True)
class _Pair:
    a: int
    b: int


async def test_a_row_class_refuses_other_columns(database_url: str) -> None:
    """The check also runs when the process first reads a statement: columns in another order
    are an error, not a row with its values swapped."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = conn.cursor(row_factory=typed_row(_Pair))
        await cur.execute("SELECT 1 AS a, 2 AS b")
        assert await cur.fetchone() == _Pair(a=1, b=2)
        cur = conn.cursor(row_factory=typed_row(_Pair))
        with pytest.raises(RowShapeError, match="expects the columns"):
            await cur.execute("SELECT 2 AS b, 1 AS a")
        cur = conn.cursor(row_factory=row_factory("ping"))
        await cur.execute(QUERIES["ping"])
        assert (await cur.fetchone()).ok == 1  # type: ignore[union-attr]
