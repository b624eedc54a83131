"""Periodic checkpoints: a background loop that seals the heads of every stream, so a truncated
stream or a deleted one is detectable (:mod:`persistence.checkpoints`). With a seal key, each
one is also signed and published to the digest sink (:mod:`persistence.seals`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from leasehold.gateway.background.loops import stop_if_cancelled
from leasehold.persistence.checkpoints import write_checkpoint
from leasehold.persistence.seals import Sealer
from leasehold.persistence.transaction import Database

log = logging.getLogger("leasehold.gateway")


async def run(db: Database, every: float, sealer: Sealer | None = None,
              on_pass: Callable[[float], None] | None = None) -> None:
    """Write a checkpoint (signed and published when ``sealer`` is given) every ``every``
    seconds, forever; a failed one is logged and retried at the next interval. After each pass
    that succeeded, ``on_pass`` gets the Unix time the newest checkpoint (or sink record) was made."""
    while True:
        await asyncio.sleep(every)
        try:
            async with db.connection() as conn:
                if sealer is not None:
                    # Another process sharing the sink may just have sealed: then this pass rests.
                    record = await sealer.seal(conn, unless_newer_than=every / 2)
                    log.info("seal", extra={"checkpoint": record["checkpoint_id"], "seal": record["seal"]})
                    made = datetime.fromisoformat(record["created_at"]).timestamp()
                else:
                    checkpoint = await write_checkpoint(conn)
                    log.info("checkpoint", extra={"checkpoint": checkpoint.id, "seal": checkpoint.seal.hex()})
                    made = checkpoint.created_at.timestamp()
            if on_pass is not None:
                on_pass(made)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            stop_if_cancelled(exc)
            log.exception("checkpoint failed; retrying at the next interval")
