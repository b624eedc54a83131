"""The unit of work: one command, one transaction, and the only way service code reaches SQL.

``Database.transaction()`` yields a :class:`Transaction`. It rolls back unless the command
calls :meth:`Transaction.commit`, and translates psycopg errors into :mod:`domain.errors` once,
here. Service code names its statements (``persistence/queries/*.sql``); it never sees a cursor.

Reads go out at once and wait for their rows; :meth:`Transaction.read` sends several reads in
one round trip (``lock, row = await tx.read(one("task_lock", p), one("task_read", p))``).
Writes wait: appended events, their projections' row changes, other data-modifying statements
and ``pg_notify`` calls are queued and travel combined (:class:`persistence.writes.WriteBuffer`)
right before the transaction's next read, savepoint or COMMIT — so a read sees every earlier
write of its transaction, and a command typically sends all its writes as one statement.

The whole transaction runs inside one psycopg pipeline, with BEGIN and COMMIT sent as ordinary
statements (pool connections are in autocommit mode): BEGIN travels with the first reads, and
the writes travel with the COMMIT. Every statement runs on a cursor of its own: in a pipeline,
psycopg may stop fetching between two queued commands, and a cursor with two commands queued
would hand its reader the first one's rows.

A connection lost while the outcome of a COMMIT is unknown (the COMMIT was queued or sent, its
answer never came) is resolved before anyone is answered: :meth:`Database.resolve_commit` looks
the transaction's last appended event up (stream, version and chain hash) on a fresh connection
to whichever server accepts writes now, waiting for one up to ``Database.resolve_seconds``. Found,
the transaction committed and the command's answer stands; absent, nothing of it committed
(:class:`ConnectionLost`) and :meth:`Database.run` runs the body again. A transaction that
only read loses nothing either way: its answer stands. One that wrote without appending an event
cannot be looked up: :class:`CommitOutcomeUnknown` (503).

``Database.read()`` is the read side: statements outside any command's transaction, each its
own, never committing anything; ``Database.snapshot()`` gives several reads one consistent
``REPEATABLE READ`` view.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeVar

import psycopg
from psycopg import AsyncConnection, AsyncCursor, errors
from psycopg.rows import BaseRowFactory, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from leasehold.domain.errors import Conflict, InvalidRequest, NotFound, Unavailable
from leasehold.domain.events import DomainEvent
from leasehold.persistence.event_log import StreamHead, record
from leasehold.persistence.queries import QUERIES
from leasehold.persistence.rows import execute_named, row_factory
from leasehold.persistence.snapshot import snapshot
from leasehold.persistence.writes import WriteBuffer
from leasehold.projections.projector import project
from leasehold.projections.rows import RowOp
from leasehold.protocol import tracing

T = TypeVar("T")
log = logging.getLogger("leasehold.persistence")
Clock = Callable[[], datetime | None]
Params = dict[str, Any]
#: A row of a named statement, read by name (see :mod:`persistence.rows`).
Row = Any

#: The channel every wake-up travels on (see :mod:`gateway.background.notify`).
NOTIFY_CHANNEL = "leasehold"


def system_clock() -> datetime | None:
    """No override: SQL falls back to the database's ``now()``."""
    return None


@dataclass(frozen=True, slots=True)
class Read:
    """A named statement to run, and the shape of its answer."""

    name: str
    params: Params
    shape: Literal["one", "all", "dicts"] = "one"


def one(name: str, params: Params) -> Read:
    """The statement's first row, or None."""
    return Read(name, params, "one")


def rows(name: str, params: Params) -> Read:
    """Every row of the statement."""
    return Read(name, params, "all")


def dicts(name: str, params: Params) -> Read:
    """Every row of the statement, as ``{column: value}``."""
    return Read(name, params, "dicts")


def _rows_of(name: str, shape: str) -> BaseRowFactory[Any]:
    """How the rows of statement ``name`` are made: ``{column: value}`` for ``dicts``, else by
    the statement's row class or as named tuples (:func:`persistence.rows.row_factory`)."""
    return dict_row if shape == "dicts" else row_factory(name)


async def _answer(cur: AsyncCursor[Any], shape: str) -> Any:
    if shape == "one":
        return await cur.fetchone()
    return await cur.fetchall()


class Transaction:
    """One command's transaction (see the module docstring). Made by :meth:`Database.transaction`."""

    __slots__ = ("_conn", "_writes", "_topics", "_sent", "_executed", "committed", "last_event")

    def __init__(self, conn: AsyncConnection[Any]) -> None:
        self._conn = conn
        self._writes = WriteBuffer()
        self._topics: list[str] = []
        self._sent = 0  # how many times queued writes were sent
        self._executed = False  # a statement ran through execute() (it may have written)
        #: COMMIT was queued: from here on, a lost connection leaves the outcome unknown.
        self.committed = False
        #: The last event appended (stream id, version, chain hash): the proof of a COMMIT.
        self.last_event: tuple[Any, int, bytes] | None = None

    # --- reads -----------------------------------------------------------------------------

    async def read(self, *reads: Read) -> list[Any]:
        """Run ``reads`` in one round trip (after the queued writes); their answers, in order."""
        await self._flush()
        cursors = []
        for r in reads:
            cur = self._conn.cursor(row_factory=_rows_of(r.name, r.shape))
            await cur.execute(QUERIES[r.name], r.params)
            cursors.append(cur)
        return [await _answer(cur, r.shape) for cur, r in zip(cursors, reads, strict=True)]

    async def one(self, name: str, params: Params) -> Row | None:
        (found,) = await self.read(one(name, params))
        return found

    async def all(self, name: str, params: Params) -> list[Row]:
        (found,) = await self.read(rows(name, params))
        return found

    async def value(self, name: str, params: Params) -> Row:
        """The one row an aggregate statement always returns."""
        found = await self.one(name, params)
        assert found is not None, f"{name} always returns a row"
        return found

    # --- writes (queued) -------------------------------------------------------------------

    def append(self, head: StreamHead, events: Sequence[DomainEvent]) -> StreamHead:
        """Append ``events`` to the stream at ``head`` and apply their projections; the new head.

        Must run in the transaction that holds the stream row's lock (``FOR UPDATE``): that
        lock serialises the stream, so versions and the hash chain advance without a table
        lock, and the unique ``(originator_id, originator_version)`` key turns any unlocked
        concurrent append into an error instead of a fork.
        """
        if not events:
            return head
        if tracing.enabled():
            events = stamped(events)
            tracing.add_event("events appended", {"leasehold.events": [type(e).__name__ for e in events]})
        recorded, new_head = record(head, events)
        last = recorded[-1]  # not a row: the records just made
        self.last_event = (last.stored.originator_id, last.stored.originator_version, last.hash)
        self._writes.events((r.stored.originator_id, r.stored.originator_version, r.stored.topic,
                             r.stored.state, r.prev_hash, r.hash) for r in recorded)
        self._writes.ops([op for r in recorded for op in project(r.event, r.hash)])
        return new_head

    def apply(self, ops: Iterable[RowOp]) -> None:
        """Queue row changes that are not an event's projection."""
        self._writes.ops(ops)

    def write(self, table: str, name: str, params: Params) -> None:
        """Queue the named data-modifying statement on ``table`` (see :meth:`WriteBuffer.statement`)."""
        self._writes.statement(table, QUERIES[name], params)

    def notify(self, topic: str) -> None:
        """Wake whoever waits on ``topic`` once (and only if) this transaction commits."""
        self._writes.notify(NOTIFY_CHANNEL, topic)
        self._topics.append(topic)

    async def execute(self, name: str, params: Params) -> None:
        """Run the named statement now, in order with the queued writes (for statements whose
        effect a later read in this transaction must see and that cannot be queued as a CTE)."""
        await self._flush()
        self._executed = True
        await self._conn.cursor().execute(QUERIES[name], params)

    # --- structure -------------------------------------------------------------------------

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        """A block whose writes are undone, alone, if it raises (the error propagates)."""
        await self._flush()
        # libpq learns the transaction status from a pipeline sync only: before one, our BEGIN
        # still looks IDLE, psycopg would take this block for the outermost transaction and
        # COMMIT at its end, ending the command's transaction (and releasing its row locks)
        # halfway. Synced, psycopg sees the open transaction and makes a real savepoint.
        async with self._conn.pipeline() as pipeline:
            await pipeline.sync()
        topics, last_event = len(self._topics), self.last_event
        try:
            async with self._conn.transaction():
                yield
                await self._flush()
        except BaseException:
            self._writes.clear()
            del self._topics[topics:]
            self.last_event = last_event  # what the savepoint undid proves nothing
            raise

    @property
    def broken(self) -> bool:
        """Whether the connection itself failed (nothing more can run on it)."""
        return self._conn.broken or self._conn.closed

    async def begin(self, *settings: str) -> None:
        """Queue BEGIN (and ``SET LOCAL`` statements), each on a cursor of its own."""
        await self._conn.cursor().execute("BEGIN")
        for setting in settings:
            await self._conn.cursor().execute(setting)

    async def commit(self) -> None:
        """Send the queued writes, then COMMIT. Without this call the transaction rolls back."""
        await self._flush()
        await self._conn.cursor().execute("COMMIT")
        self.committed = True

    async def rollback(self) -> None:
        """Drop the queued writes and queue ROLLBACK (what was sent is undone)."""
        self._writes.clear()
        self._topics.clear()
        self.last_event = None
        await self._conn.cursor().execute("ROLLBACK")

    @property
    def wrote_nothing(self) -> bool:
        """Whether this transaction only read (whether its COMMIT happened changes nothing)."""
        return self._sent == 0 and not self._writes and not self._executed

    @property
    def topics(self) -> list[str]:
        """The wake-ups this transaction will send at COMMIT."""
        return self._topics

    async def _flush(self) -> None:
        if self._writes:
            self._sent += 1
            await self._writes.flush(self._conn.cursor())


class Reader:
    """Statements outside any command: each runs on its own (or inside one snapshot), and
    nothing commits. Made by :meth:`Database.read` and :meth:`Database.snapshot`."""

    __slots__ = ("_conn",)

    def __init__(self, conn: AsyncConnection[Any]) -> None:
        self._conn = conn

    async def one(self, name: str, params: Params) -> Row | None:
        cur = await self._run(name, params, "one")
        return await cur.fetchone()

    async def all(self, name: str, params: Params) -> list[Row]:
        cur = await self._run(name, params, "all")
        return await cur.fetchall()

    async def value(self, name: str, params: Params) -> Row:
        """The one row an aggregate statement always returns."""
        found = await self.one(name, params)
        assert found is not None, f"{name} always returns a row"
        return found

    async def dicts(self, name: str, params: Params) -> list[dict[str, Any]]:
        cur = await self._run(name, params, "dicts")
        return await cur.fetchall()

    async def _run(self, name: str, params: Params, shape: str) -> AsyncCursor[Any]:
        cur = self._conn.cursor(row_factory=_rows_of(name, shape))
        await cur.execute(QUERIES[name], params)
        return cur


class Database:
    """The pool, and the two ways to use it: a command's transaction, or reads.

    ``on_commit`` is called with the wake-up topics of every committed transaction (the
    Gateway's Redis hints publish them).
    """

    def __init__(self, pool: AsyncConnectionPool, *,
                 on_commit: Callable[[list[str]], None] | None = None, resolve_seconds: float = 30.0) -> None:
        self.pool = pool
        self.on_commit = on_commit
        #: How long a lost COMMIT's outcome, or a body lost with its connection, waits for a
        #: writable server (a failover) before the command answers 503.
        self.resolve_seconds = resolve_seconds
        self._checking: asyncio.Task[None] | None = None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """A fresh transaction; it commits only through :meth:`Transaction.commit`.

        Its connection lost: :class:`ConnectionLost` when nothing of it committed (also after a
        lost COMMIT that :meth:`resolve_commit` found absent), :class:`CommitOutcomeUnknown` when
        that cannot be told; a lost COMMIT found in the log ends the block as if it had answered."""
        tx: Transaction | None = None
        try:
            with tracing.span("transaction", child_only=True), translated_errors():
                async with self.pool.connection() as conn:
                    tx = Transaction(conn)
                    try:
                        async with conn.pipeline():
                            await tx.begin()
                            yield tx
                            if not tx.committed:  # left without a commit: undo what was sent
                                await tx.rollback()
                    except BaseException:
                        await abandon(conn)
                        raise
        except Unavailable as exc:
            if tx is None or not tx.broken:
                raise
            self.connection_lost()
            if not tx.committed:
                raise ConnectionLost("the database connection was lost; nothing was committed") from exc
            committed = await self.resolve_commit(tx)
            if committed is None:
                raise CommitOutcomeUnknown("the database connection was lost during COMMIT") from exc
            if not committed:
                raise ConnectionLost("the database connection was lost during COMMIT, which did not happen") from exc
            log.warning("a COMMIT whose connection was lost is in the log: the command's answer stands")
        if tx.committed and tx._topics and self.on_commit is not None:
            self.on_commit(tx._topics)

    def connection_lost(self) -> None:
        """A pooled connection broke (a server restart, a failover): have the pool check its idle
        connections now, so that the next commands do not meet the other dead ones one by one."""
        if self._checking is None or self._checking.done():
            self._checking = asyncio.create_task(self._check_pool(), name="leasehold-pool-check")

    async def _check_pool(self) -> None:
        try:
            await self.pool.check()
        except Exception as exc:  # the pool was closed meanwhile: nothing to check
            log.debug("pool check failed", extra={"error": str(exc)})

    async def resolve_commit(self, tx: Transaction) -> bool | None:
        """Whether ``tx``, whose connection was lost after its COMMIT was queued, committed: its
        last appended event looked up on a writable server (waiting for one, a failover say, up
        to ``resolve_seconds``). True for a transaction that only read (nothing to lose); None
        when it wrote without appending an event, or no server answered in time.

        Synchronous replication makes the answer final: a COMMIT that did not reach the
        synchronous standby was never acknowledged by the old primary, and a promoted standby
        does not have it (the old primary's copy is rewound when it rejoins)."""
        if tx.last_event is None:
            return True if tx.wrote_nothing else None
        originator_id, version, chain_hash = tx.last_event
        params = {"originator_id": originator_id, "originator_version": version, "hash": chain_hash}
        deadline = time.monotonic() + self.resolve_seconds
        delay = 0.05
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                async with self.pool.connection(timeout=remaining) as conn:
                    cur = await execute_named(conn, QUERIES["event_committed"], params)
                    found = await cur.fetchone()
                    return bool(found is not None and found.committed)
            except (psycopg.Error, PoolTimeout, OSError):
                await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 2, 1.0)

    async def run(self, body: Callable[[Transaction], Awaitable[T]]) -> T:
        """Run ``body`` in a transaction and commit it; ``body``'s result.

        ``body`` reads and queues writes on the transaction it is given and must not commit.
        """
        deadline = time.monotonic() + self.resolve_seconds
        delay = 0.05
        while True:
            try:
                async with self.transaction() as tx:
                    result = await body(tx)
                    await tx.commit()
                return result
            except ConnectionLost:
                # Nothing of it committed: run it again on a fresh connection, while a failover
                # may still be promoting the standby.
                if time.monotonic() + delay >= deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Reader]:
        """Reads outside a command, each statement on its own."""
        with translated_errors():
            async with self.pool.connection() as conn:
                yield Reader(conn)

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[Reader]:
        """Several reads that see one moment (``REPEATABLE READ, READ ONLY``: the module function
        :func:`persistence.snapshot.snapshot` on a pooled connection)."""
        with translated_errors():
            async with self.pool.connection() as conn, snapshot(conn):
                yield Reader(conn)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection for the persistence functions that run a whole job of their own
        (:func:`persistence.checkpoints.write_checkpoint`)."""
        with translated_errors():
            async with self.pool.connection() as conn:
                yield conn

    async def ping(self) -> None:
        """Raise :class:`domain.errors.Unavailable` unless the database answers."""
        async with self.read() as reader:
            await reader.one("ping", {})


def stamped(events: Sequence[DomainEvent]) -> Sequence[DomainEvent]:
    """``events`` with the current trace stamped on those that record it (``DomainEvent.traced``),
    when the current span is sampled; as they are otherwise."""
    trace_id = tracing.trace_id()
    if trace_id is None:
        return events
    return [e if e.traced is None else e.model_copy(
        update={e.traced: tracing.traceparent() if e.traced == "traceparent" else trace_id}) for e in events]


class ConnectionLost(Unavailable):
    """The connection broke and nothing of the transaction committed: safe to run again."""


class CommitOutcomeUnknown(Unavailable):
    """The connection broke during COMMIT and whether it happened could not be found out."""


async def abandon(conn: AsyncConnection[Any]) -> None:
    """After a failure inside a transaction: roll it back, unless the connection is gone.

    ``conn.rollback()``, not a ROLLBACK statement: it also forgets psycopg's prepared statements.
    A statement psycopg meant to prepare in the failed pipeline was skipped by the server, and
    would otherwise be "prepared" only client-side."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE and not conn.closed:
        await conn.rollback()


class translated_errors:
    """psycopg errors -> :mod:`domain.errors`, the one place where they are translated."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is None or not isinstance(exc, psycopg.Error | PoolTimeout):
            return
        if isinstance(exc, errors.UniqueViolation):
            constraint = exc.diag.constraint_name
            raise Conflict(f"conflicts with an existing record ({constraint})", constraint=constraint) from exc
        if isinstance(exc, errors.ForeignKeyViolation):
            raise NotFound("a referenced resource does not exist") from exc
        if isinstance(exc, errors.CheckViolation | errors.NotNullViolation | errors.InvalidTextRepresentation
                      | errors.NumericValueOutOfRange | errors.StringDataRightTruncation):
            raise InvalidRequest(f"rejected by the database: {exc.diag.message_primary}") from exc
        if isinstance(exc, errors.SerializationFailure | errors.DeadlockDetected):
            raise Conflict("the change raced with another; retry") from exc
        if isinstance(exc, psycopg.OperationalError | PoolTimeout):
            raise Unavailable("the database is unavailable") from exc
