"""One transaction per command, pipelined, with psycopg errors translated once.

The whole transaction runs inside a psycopg pipeline: reads sync when their rows are fetched,
and every write after the last read travels with the COMMIT in a single round trip.
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

Clock = Callable[[], datetime | None]


def system_clock() -> datetime | None:
    """No override: SQL falls back to the database's ``now()``."""
    return None


@asynccontextmanager
async def transaction(pool: AsyncConnectionPool) -> AsyncIterator[AsyncCursor[Any]]:
    """A cursor in a fresh transaction that commits on normal exit and rolls back on error."""
    try:
        async with pool.connection() as conn, conn.pipeline(), conn.transaction(), conn.cursor() as cur:
            yield cur
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
