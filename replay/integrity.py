"""``replay verify-chain``: walk every stream's hash chain, then hold the log against the checkpoints.

The walk reads the whole log in (stream, version) order through a server-side cursor and
checks each link with :func:`persistence.chain.check_link` (the same rule as
:func:`persistence.chain.verify_chains`), keeping the first break of each stream. The chains
catch an edited, deleted, reordered or inserted event anywhere before a stream's last event;
the checkpoints (:mod:`persistence.checkpoints`) catch what a chain cannot: a stream deleted whole,
a truncated tail, or a stream rewritten from some point on with recomputed hashes.
Everything is read in one ``REPEATABLE READ`` snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from persistence.chain import ChainBreak, check_link
from persistence.checkpoints import Checkpoint, CheckpointProblem, verify_checkpoints
from replay.snapshot import snapshot


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding: a broken link (``source="chain"``) or a checkpoint mismatch."""

    source: str
    originator_id: UUID | None
    version: int | None
    message: str
    checkpoint_id: int | None = None

    def __str__(self) -> str:
        where = f"stream {self.originator_id} v{self.version}" if self.originator_id else "checkpoints"
        cp = f" [checkpoint {self.checkpoint_id}]" if self.checkpoint_id is not None else ""
        return f"{where}: {self.message}{cp}"


@dataclass(frozen=True, slots=True)
class IntegrityReport:
    streams: int
    events: int
    checkpoints: list[Checkpoint]
    problems: list[Problem]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def latest(self) -> Checkpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None


async def walk_chains(conn: AsyncConnection[Any], *, batch_size: int = 20_000,
                      progress: Callable[[int], None] | None = None) -> tuple[int, int, list[ChainBreak]]:
    """(streams, events, first break of each broken stream), in one pass over the log."""
    breaks: list[ChainBreak] = []
    streams = events = 0
    current: UUID | None = None
    prev: tuple[int, bytes] | None = None
    broken = False
    async with conn.cursor(name="replay_chain_walk", binary=True) as cur:
        await cur.execute("SELECT originator_id, originator_version, topic, state, prev_hash, hash FROM events"
                          " ORDER BY originator_id, originator_version")
        while rows := await cur.fetchmany(batch_size):
            for oid, version, topic, state, prev_hash, h in rows:
                if oid != current:
                    current, prev, broken = oid, None, False
                    streams += 1
                if not broken:
                    problem = check_link(prev, oid, version, topic, state, prev_hash, h)
                    if problem is not None:
                        breaks.append(ChainBreak(oid, version, problem))
                        broken = True
                prev = (version, h)
            events += len(rows)
            if progress is not None:
                progress(events)
    return streams, events, breaks


async def verify_log(conn: AsyncConnection[Any], *, progress: Callable[[int], None] | None = None
                     ) -> IntegrityReport:
    """Chains and checkpoints, in one snapshot; problems sorted by stream and version."""
    started = time.perf_counter()
    async with snapshot(conn):
        streams, events, breaks = await walk_chains(conn, progress=progress)
        checkpoints, cp_problems = await verify_checkpoints(conn)
    problems = [Problem("chain", b.originator_id, b.originator_version, b.problem) for b in breaks]
    problems += [_from_checkpoint(p) for p in cp_problems]
    problems.sort(key=lambda p: (p.originator_id is not None, str(p.originator_id), p.version or 0, p.source))
    return IntegrityReport(streams, events, checkpoints, problems, time.perf_counter() - started)


def _from_checkpoint(p: CheckpointProblem) -> Problem:
    return Problem("checkpoint", p.originator_id, p.version, p.problem, p.checkpoint_id)
