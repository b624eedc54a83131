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

from leasehold.persistence.chain import walk_chains
from leasehold.persistence.checkpoints import Checkpoint, CheckpointProblem, verify_checkpoints
from leasehold.persistence.partitions import archive_records
from leasehold.persistence.snapshot import snapshot
from leasehold.replay.archive import ArchiveSet
from leasehold.replay.digests import DigestProblem, Digests, Unsealed, log_against_digests


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding: a broken link (``source="chain"``) or a checkpoint mismatch."""

    source: str
    originator_id: UUID | None
    version: int | None
    message: str
    checkpoint_id: int | None = None

    def __str__(self) -> str:
        where = (f"stream {self.originator_id} v{self.version}" if self.originator_id
                 else "archives" if self.source == "archive" else "checkpoints")
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
    #: Events read from archives (``--archive``), besides the live log's ``events``.
    archived_events: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def latest(self) -> Checkpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None


async def verify_log(conn: AsyncConnection[Any], *, progress: Callable[[int], None] | None = None,
                     digests: Digests | None = None, archives: ArchiveSet | None = None) -> IntegrityReport:
    """Chains and checkpoints (and the log against ``digests``, when given: see
    :mod:`replay.digests`), in one snapshot; problems sorted by stream and version.

    With ``archives`` (verified and joined already), each stream's chain continues from where
    its archived part ends, a sealed head that was archived is found in its archive, every
    partition the register says was archived must be among them, and each of them must be in
    the register. Without them, a log whose old partitions were archived reports those
    partitions as missing."""
    started = time.perf_counter()
    unsealed = None
    digest_problems: list[DigestProblem] = list(digests.problems) if digests is not None else []
    given = archives or ArchiveSet([])
    async with snapshot(conn):
        walk = await walk_chains(conn, progress=progress, seed=given.tails)
        checkpoints, cp_problems = await verify_checkpoints(conn, archived=given.hashes_at)
        if digests is not None:
            found, unsealed = await log_against_digests(conn, digests, checkpoints, given.hashes_at)
            digest_problems += found
        register = await archive_records(conn)
    problems = [Problem("archive", None, None, p) for p in given.problems]
    for record in register:
        if record.manifest_sha256 not in given.manifests:
            problems.append(Problem("archive", None, None, (
                f"partition {record.partition_name} (up to {record.upper_bound.isoformat()}, {record.events} events)"
                f" was archived with manifest sha256 {record.manifest_sha256}: give that archive (--archive)")))
    registered = {r.manifest_sha256 for r in register}
    for check in given.checks:
        if check.manifest_sha256 and check.manifest_sha256 not in registered:
            problems.append(Problem("archive", None, None, (
                f"archive {check.directory}: its manifest (sha256 {check.manifest_sha256}) is not in the"
                " log's register of archived partitions")))
    problems += [Problem("chain", b.originator_id, b.originator_version, b.problem) for b in walk.breaks]
    problems += [_from_checkpoint(p) for p in cp_problems]
    problems += [Problem("digest", p.originator_id, p.version, p.message, p.checkpoint_id) for p in digest_problems]
    problems.sort(key=lambda p: (p.originator_id is not None, str(p.originator_id), p.version or 0, p.source))
    return IntegrityReport(walk.streams, walk.events, checkpoints, problems, time.perf_counter() - started,
                           digests, unsealed, sum(c.events for c in given.checks))


def _from_checkpoint(p: CheckpointProblem) -> Problem:
    return Problem("checkpoint", p.originator_id, p.version, p.problem, p.checkpoint_id)
