"""One transaction per command, pipelined, with psycopg errors translated once.

The whole transaction runs inside one psycopg pipeline, with BEGIN and COMMIT sent as ordinary
statements (pool connections are in autocommit mode): BEGIN travels with the first reads, a
read syncs when its rows are fetched, and every write after the last read travels with the
COMMIT in a single round trip. (psycopg's ``conn.transaction()`` inside a pipeline would add a
sync of its own for BEGIN, for COMMIT and for the nested pipeline it opens.)

The cursor is a :class:`persistence.writes.BufferedCursor`: appends, notifications and the other
buffered writes are queued, not executed, and go out combined into as few statements as the
rules in :mod:`persistence.writes` allow, right before the next statement of the transaction (a
read, a savepoint, COMMIT) — so reads see the transaction's writes, and a command typically
sends one statement for all its writes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncCursor, errors
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from domain.errors import Conflict, InvalidRequest, NotFound, Unavailable
from persistence.writes import BufferedCursor

Clock = Callable[[], datetime | None]


def system_clock() -> datetime | None:
    """No override: SQL falls back to the database's ``now()``."""
    return None


@asynccontextmanager
async def transaction(pool: AsyncConnectionPool) -> AsyncIterator[AsyncCursor[Any]]:
    """A cursor in a fresh transaction that commits on normal exit and rolls back on error."""
    try:
        async with pool.connection() as conn:
            try:
                async with conn.pipeline(), BufferedCursor(conn) as cur:
                    # BEGIN on a cursor of its own: a cursor must never have two commands queued
                    # before its reader fetches (see BufferedCursor), and cur's first read follows.
                    await conn.execute("BEGIN")
                    yield cur
                    await cur.commit()  # sends the queued writes first
            except BaseException:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE and not conn.closed:
                    # conn.rollback(), not a ROLLBACK statement: it also forgets psycopg's prepared
                    # statements. A statement psycopg meant to prepare in the failed pipeline was
                    # skipped by the server, and would otherwise be "prepared" only client-side.
                    await conn.rollback()
                raise
    except errors.UniqueViolation as exc:
        constraint = exc.diag.constraint_name
        raise Conflict(f"conflicts with an existing record ({constraint})", constraint=constraint) from exc
    except errors.ForeignKeyViolation as exc:
        raise NotFound("a referenced resource does not exist") from exc
    except (errors.CheckViolation, errors.NotNullViolation, errors.InvalidTextRepresentation,
            errors.NumericValueOutOfRange, errors.StringDataRightTruncation) as exc:
        raise InvalidRequest(f"rejected by the database: {exc.diag.message_primary}") from exc
    except (errors.SerializationFailure, errors.DeadlockDetected) as exc:
        raise Conflict("the change raced with another; retry") from exc
    except (psycopg.OperationalError, PoolTimeout) as exc:
        raise Unavailable("the database is unavailable") from exc
