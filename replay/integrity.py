"""``replay verify-chain``: walk every stream's hash chain, then hold the log against the checkpoints.

The walk (:func:`persistence.chain.walk_chains`) reads the whole log in (stream, version) order
through a server-side cursor and checks each link, keeping the first break of each stream. The chains
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

from persistence.chain import walk_chains
from persistence.checkpoints import Checkpoint, CheckpointProblem, verify_checkpoints
from persistence.snapshot import snapshot
from replay.digests import DigestProblem, Digests, Unsealed, log_against_digests


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
    #: With digests: how many records, the newest one, and what no digest covers yet.
    digests: Digests | None = None
    unsealed: Unsealed | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def latest(self) -> Checkpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None


async def verify_log(conn: AsyncConnection[Any], *, progress: Callable[[int], None] | None = None,
                     digests: Digests | None = None) -> IntegrityReport:
    """Chains and checkpoints (and the log against ``digests``, when given: see
    :mod:`replay.digests`), in one snapshot; problems sorted by stream and version."""
    started = time.perf_counter()
    unsealed = None
    digest_problems: list[DigestProblem] = list(digests.problems) if digests is not None else []
    async with snapshot(conn):
        walk = await walk_chains(conn, progress=progress)
        checkpoints, cp_problems = await verify_checkpoints(conn)
        if digests is not None:
            found, unsealed = await log_against_digests(conn, digests, checkpoints)
            digest_problems += found
    problems = [Problem("chain", b.originator_id, b.originator_version, b.problem) for b in walk.breaks]
    problems += [_from_checkpoint(p) for p in cp_problems]
    problems += [Problem("digest", p.originator_id, p.version, p.message, p.checkpoint_id) for p in digest_problems]
    problems.sort(key=lambda p: (p.originator_id is not None, str(p.originator_id), p.version or 0, p.source))
    return IntegrityReport(walk.streams, walk.events, checkpoints, problems, time.perf_counter() - started,
                           digests, unsealed)


def _from_checkpoint(p: CheckpointProblem) -> Problem:
    return Problem("checkpoint", p.originator_id, p.version, p.problem, p.checkpoint_id)
