"""Group commit: concurrent commands share one transaction and one COMMIT.

A command's cost on the database is dominated by per-statement and per-transaction work (BEGIN,
COMMIT and its WAL flush, snapshot and transaction bookkeeping), not by its rows. So under load
the Gateway runs the bodies of concurrent commands (:meth:`persistence.transaction.Database.run`)
one after the other inside one transaction per *lane* and commits them together; when it is
idle, a body runs at once in a transaction of its own, as before (no waiting window).

The rules that keep this safe:

* **No answer before its commit.** A body's result is handed back only after the COMMIT that
  made its writes durable; a body that refused (a domain error raised before it sent any write)
  gets its error at once — it changed nothing.
* **A refusal does not fail its neighbours.** Writes are queued until the next statement, and a
  lane sends the previous body's writes before starting the next one, so a body that raises
  before its first read has sent nothing: its queued writes are dropped and the others go on.
  A body that raises after sending writes, or any error the database raises (a unique
  violation, a deadlock, a lost connection), fails the shared transaction: it is rolled back and
  every body of it runs again, each in a transaction of its own, where each gets its own answer.
  Bodies therefore only read and queue writes (:meth:`Database.run`), and may run twice.
* **Bounded waits.** A lane holds every row lock its bodies took until its COMMIT, so lanes
  could wait on each other in a cycle that only PostgreSQL's deadlock detector (one second)
  would break. A shared transaction therefore runs with a short ``lock_timeout``: a body that
  waits longer fails the batch, which is rolled back and run body by body (without the
  timeout). Bodies with the same ``key`` (one worker's commands: they lock the same worker and
  task rows) always go to the same lane, so they never wait on each other across lanes.
* **Bounded batches.** A lane commits after ``max_batch`` bodies even when more are queued.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg

from leasehold.domain.errors import LeaseholdError
from leasehold.persistence.transaction import Database, Transaction, abandon

T = TypeVar("T")
Body = Callable[[Transaction], Awaitable[Any]]

log = logging.getLogger("leasehold.group_commit")


@dataclass(slots=True)
class _Pending:
    body: Body
    answer: asyncio.Future[Any]


@dataclass(slots=True)
class _Lane:
    queue: deque[_Pending] = field(default_factory=deque)
    running: bool = False


class _SharedTransactionFailed(Exception):
    """The shared transaction cannot commit; its bodies run again one by one."""


@dataclass(slots=True)
class GroupStats:
    """What the lanes did (for metrics and benchmarks)."""

    transactions: int = 0
    bodies: int = 0
    retried_alone: int = 0
    largest: int = 0


class GroupCommit:
    """Shares transactions between the bodies handed to :meth:`Database.run` (see the module doc).

    ``lanes`` bounds how many shared transactions run at once (each holds a pooled connection
    while it runs); ``lock_timeout_ms`` bounds a body's wait for a row lock inside one.
    """

    def __init__(self, db: Database, *, lanes: int = 4, max_batch: int = 32, lock_timeout_ms: int = 50) -> None:
        if lanes < 1 or max_batch < 1:
            raise ValueError("lanes and max_batch must be at least 1")
        self.db = db
        self.max_batch = max_batch
        self._settings = (f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}",)
        self._lanes = [_Lane() for _ in range(lanes)]
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = GroupStats()

    def install(self) -> GroupCommit:
        """Make ``db.run`` share transactions through this committer."""
        self.db.group = self
        return self

    async def submit(self, body: Callable[[Transaction], Awaitable[T]], key: object) -> T:
        lane = self._lane_for(key)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        lane.queue.append(_Pending(body, answer))
        if not lane.running:
            lane.running = True
            task = asyncio.create_task(self._drain(lane), name="leasehold-group-commit")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await answer

    def _lane_for(self, key: object) -> _Lane:
        if key is not None:
            return self._lanes[hash(key) % len(self._lanes)]
        idle = next((lane for lane in self._lanes if not lane.running), None)
        return idle or min(self._lanes, key=lambda lane: len(lane.queue))

    async def _drain(self, lane: _Lane) -> None:
        try:
            while lane.queue:
                batch = [lane.queue.popleft() for _ in range(min(self.max_batch, len(lane.queue)))]
                batch = [p for p in batch if not p.answer.done()]  # the caller went away
                if batch:
                    await self._run_batch(batch)
        finally:
            lane.running = False
            if lane.queue:  # arrived while this task was finishing
                lane.running = True
                task = asyncio.create_task(self._drain(lane), name="leasehold-group-commit")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _run_batch(self, batch: list[_Pending]) -> None:
        if len(batch) == 1:
            (alone,) = batch
            await self._run_alone(alone)
            return
        try:
            done = await self._run_shared(batch)
        except _SharedTransactionFailed:
            self.stats.retried_alone += len(batch)
            for pending in batch:
                if not pending.answer.done():
                    await self._run_alone(pending)
            return
        except BaseException as exc:  # the lane itself was cancelled or broke
            for pending in batch:
                if not pending.answer.done():
                    pending.answer.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            raise
        self.stats.transactions += 1
        self.stats.bodies += len(done)
        self.stats.largest = max(self.stats.largest, len(done))
        for pending, result in done:
            if not pending.answer.done():
                pending.answer.set_result(result)

    async def _run_shared(self, batch: list[_Pending]) -> list[tuple[_Pending, Any]]:
        """Run ``batch`` in one transaction; the bodies that succeeded with their results (the
        refusals are answered on the way). Raises :class:`_SharedTransactionFailed` when the
        transaction cannot commit."""
        done: list[tuple[_Pending, Any]] = []
        topics: list[str] = []
        try:
            async with self.db.pool.connection() as conn:
                tx = Transaction(conn)
                try:
                    async with conn.pipeline():
                        await tx.begin(*self._settings)
                        for pending in batch:
                            sent = await tx.settle()
                            topics_before = len(tx.topics)
                            try:
                                result = await pending.body(tx)
                            except LeaseholdError as refusal:
                                if tx.writes_sent != sent:  # it refused after sending writes
                                    raise _SharedTransactionFailed from refusal
                                tx.drop_queued(topics_before)
                                if not pending.answer.done():
                                    pending.answer.set_exception(refusal)
                                continue
                            except Exception as exc:  # not a refusal: let it fail alone
                                raise _SharedTransactionFailed from exc
                            done.append((pending, result))
                        await tx.commit()
                    topics = list(tx.topics)
                except BaseException:
                    await abandon(conn)
                    raise
        except _SharedTransactionFailed:
            raise
        except (psycopg.Error, OSError) as exc:  # the database refused or went away
            log.debug("shared transaction failed; its bodies run one by one", extra={"error": str(exc)})
            raise _SharedTransactionFailed from exc
        if topics and self.db.on_commit is not None:
            self.db.on_commit(topics)
        return done

    async def _run_alone(self, pending: _Pending) -> None:
        """One body in a transaction of its own, exactly as without group commit."""
        try:
            async with self.db.transaction() as tx:
                result = await pending.body(tx)
                await tx.commit()
        except Exception as exc:
            if not pending.answer.done():
                pending.answer.set_exception(exc)
            return
        if not pending.answer.done():
            pending.answer.set_result(result)

    async def close(self) -> None:
        """Wait for the lanes to finish what they hold."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
