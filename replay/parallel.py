"""Rebuild and verify at audit scale: bounded memory, all cores, one snapshot.

The log is folded stream group by stream group (:func:`replay.fold.fold_groups`): the groups
are split into ranges of the uuid space (ids are random ``uuid4``, so equal ranges hold about
equal work), and each range is folded in chunks of complete groups. For ``verify`` each chunk is
compared (:class:`projections.compare.Comparison`) with the live rows of the same groups, read
in group order by one server-side cursor per table (:class:`persistence.tables.GroupRows`); for
``rebuild`` each chunk is copied into the new schema. Either way a chunk is forgotten once
handled, so memory holds a chunk (a few tens of MB), not the log.

With ``jobs`` above 1 the ranges (``RANGES_PER_JOB`` per process, so a slow range does not
hold the others up) are handed to that many processes. The parent holds a ``REPEATABLE READ``
snapshot open and exports it; every process imports it (:func:`persistence.snapshot.snapshot`
with ``shared``), so all of them read the same moment of the log and of the projections.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from leasehold.persistence.connection import connect
from leasehold.persistence.event_log import batches_of_groups, count_events, group_batches
from leasehold.persistence.snapshot import export_snapshot, snapshot
from leasehold.persistence.tables import GroupRows, TableLoader, commit_without_flush_wait
from leasehold.projections.compare import Comparison
from leasehold.projections.memory import ProjectionError, Tables
from leasehold.projections.rows import PRIMARY_KEYS, TABLE_ORDER
from leasehold.replay.fold import CHUNK_EVENTS, Progress, fold_groups
from leasehold.replay.gcpause import gc_paused

RANGES_PER_JOB = 1
#: Below this many (estimated) events per process, another process costs more than it saves.
EVENTS_PER_JOB = 100_000

FIRST = UUID(int=0)
Range = tuple[UUID, UUID | None]


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def default_jobs(estimated_events: int | None) -> int:
    """All cores, but no more processes than the log has work for."""
    return max(1, min(cores(), (estimated_events or 0) // EVENTS_PER_JOB))


def uuid_ranges(parts: int) -> list[Range]:
    """``parts`` equal ranges covering the whole uuid space, the last one open-ended."""
    step = (1 << 128) // parts
    starts = [UUID(int=n * step) for n in range(parts)]
    return [(start, starts[n + 1] if n + 1 < parts else None) for n, start in enumerate(starts)]


@dataclass(slots=True)
class Part:
    """What one range (or one list of groups) gave: events folded, rows, and for verify the
    comparison."""

    events: int = 0
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PRIMARY_KEYS, 0))
    comparison: Comparison = field(default_factory=Comparison)

    def merge(self, other: Part) -> None:
        self.events += other.events
        for table, count in other.rows.items():
            self.rows[table] += count
        self.comparison.merge(other.comparison)


# --- one range, in the current process ----------------------------------------------------------


async def verify_range(conn: AsyncConnection[Any], schema: str, lo: UUID, hi: UUID | None, *,
                       chunk_events: int = CHUNK_EVENTS, progress: Progress | None = None,
                       live_conn: AsyncConnection[Any] | None = None) -> Part:
    """Fold the groups in ``[lo, hi)`` and compare them with their live rows in ``schema``
    (inside ``conn``'s snapshot; the live rows are read on ``live_conn`` if given, a second
    connection in the same snapshot, so both streams are read ahead at once)."""
    live = {table: GroupRows(live_conn or conn, schema, table) for table in PRIMARY_KEYS}
    for rows in live.values():
        await rows.open_range(lo, hi)
    return await _compare(conn, live, group_batches(conn, lo, hi), chunk_events, progress)


async def verify_groups(conn: AsyncConnection[Any], schema: str, groups: list[UUID], streams: list[UUID], *,
                        chunk_events: int = CHUNK_EVENTS, progress: Progress | None = None) -> Part:
    """The same for a list of groups (``streams``: streams known to be in them)."""
    live = {table: GroupRows(conn, schema, table) for table in PRIMARY_KEYS}
    for rows in live.values():
        await rows.open_groups(groups)
    return await _compare(conn, live, batches_of_groups(conn, groups, streams), chunk_events, progress)


async def _compare(conn: AsyncConnection[Any], live: dict[str, GroupRows], batches: Any, chunk_events: int,
                   progress: Progress | None) -> Part:
    part = Part()
    try:
        with gc_paused():
            async for chunk in fold_groups(batches, chunk_events=chunk_events, progress=progress):
                rows: Tables = {table: await g.until(chunk.bound) for table, g in live.items()}
                part.comparison.add(rows, chunk.tables)
                part.events += chunk.events
                for table, found in rows.items():
                    part.rows[table] += len(found)
    finally:
        for g in live.values():
            await g.close()
    return part


async def load_range(conn: AsyncConnection[Any], loader: TableLoader, lo: UUID, hi: UUID | None, *,
                     chunk_events: int = CHUNK_EVENTS, progress: Progress | None = None) -> Part:
    """Fold the groups in ``[lo, hi)`` and copy their rows with ``loader``."""
    part = Part()
    with gc_paused():
        async for chunk in fold_groups(group_batches(conn, lo, hi), chunk_events=chunk_events, progress=progress):
            for table in TABLE_ORDER:
                rows = chunk.tables[table]
                await loader.copy(table, rows.values())
                part.rows[table] += len(rows)
            part.events += chunk.events
    return part


# --- every range, in this process or in several ---------------------------------------------


async def over_ranges(conn: AsyncConnection[Any], url: str, task: tuple[Any, ...], *, jobs: int,
                      progress: Progress | None = None) -> Part:
    """Run ``task`` (see :func:`_run_task`) over every uuid range, inside ``conn``'s snapshot (which
    must be open): here when ``jobs`` is 1, else in ``jobs`` processes that share the snapshot.
    Raises :class:`~projections.memory.ProjectionError` when some events were in no group (a
    stream whose first event is gone)."""
    total = Part()
    if jobs <= 1 and task[0] == "verify" and url:
        async with await connect(url, application_name="leasehold-replay") as live, \
                snapshot(live, shared=await export_snapshot(conn)):
            total.merge(await _run_task(conn, task, (FIRST, None), progress or (lambda n: None), live))
    elif jobs <= 1:
        total.merge(await _run_task(conn, task, (FIRST, None), progress or (lambda n: None)))
    else:
        total = await _in_processes(conn, url, task, jobs, progress)
    expected = await count_events(conn)
    if total.events != expected:
        raise ProjectionError(f"{expected - total.events} events belong to streams whose first event is missing")
    return total


async def _run_task(conn: AsyncConnection[Any], task: tuple[Any, ...], where: Range, progress: Progress,
                    live: AsyncConnection[Any] | None = None) -> Part:
    """One range of one task: ``("verify", schema)``; ``("load", url, schema)``, copying into
    ``schema`` on a connection of its own (in a worker process); ``("load_into", target, schema)``,
    copying on the caller's ``target`` connection, in its transaction (in this process)."""
    kind = task[0]
    lo, hi = where
    if kind == "verify":
        return await verify_range(conn, task[1], lo, hi, progress=progress, live_conn=live)
    if kind == "load_into":  # in this process, on the caller's target connection and transaction
        return await load_range(conn, TableLoader(task[1], task[2]), lo, hi, progress=progress)
    if kind == "load":
        async with await connect(task[1], application_name="leasehold-replay") as target, target.transaction():
            await commit_without_flush_wait(target)  # derived data, made again after a crash
            return await load_range(conn, TableLoader(target, task[2]), lo, hi, progress=progress)
    raise ValueError(kind)


async def _in_processes(conn: AsyncConnection[Any], url: str, task: tuple[Any, ...], jobs: int,
                        progress: Progress | None) -> Part:
    shared = await export_snapshot(conn)
    context = multiprocessing.get_context("spawn")
    counter = context.Value("q", 0)
    ranges = uuid_ranges(jobs * RANGES_PER_JOB)
    total = Part()
    with context.Pool(jobs, initializer=_init_worker, initargs=(counter,)) as pool:
        result = pool.map_async(_worker, [(url, shared, task, where) for where in ranges], chunksize=1)
        while not result.ready():
            await asyncio.sleep(0.1)
            if progress is not None:
                progress(counter.value)
        for part in result.get():
            total.merge(part)
    if progress is not None:
        progress(total.events)
    return total


_counter: Any = None


def _init_worker(counter: Any) -> None:
    global _counter
    _counter = counter


def _worker(args: tuple[str, str, tuple[Any, ...], Range]) -> Part:
    url, shared, task, where = args
    return asyncio.run(_work(url, shared, task, where))


async def _work(url: str, shared: str, task: tuple[Any, ...], where: Range) -> Part:
    reported = 0

    def report(done: int) -> None:
        nonlocal reported
        with _counter.get_lock():
            _counter.value += done - reported
        reported = done

    async with await connect(url, application_name="leasehold-replay") as conn, snapshot(conn, shared=shared), \
            await connect(url, application_name="leasehold-replay") as live, snapshot(live, shared=shared):
        try:
            return await _run_task(conn, task, where, report, live if task[0] == "verify" else None)
        except (ProjectionError, ValueError) as exc:
            raise type(exc)(str(exc)) from None  # what crosses back to the parent is its message
        except Exception as exc:  # some driver errors do not survive pickling
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from None
