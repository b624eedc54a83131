"""Gauges that need the database: sampled by a background loop, never on a request's path."""

from __future__ import annotations

import asyncio
import time

from leasehold.gateway.background.loops import stop_if_cancelled
from leasehold.gateway.metrics import Metrics
from leasehold.persistence.transaction import Database


async def run(db: Database, metrics: Metrics, every: float = 5.0) -> None:
    """Sample the live leases, the queue depth by organisation and state and the oldest pending
    age every ``every`` seconds, forever (an outage skips a sample)."""
    while True:
        try:
            await sample(db, metrics)
            metrics.passed("sampler")
        except Exception as exc:  # an outage skips a sample; a cancellation stops the loop
            stop_if_cancelled(exc)
        await asyncio.sleep(every)


async def sample(db: Database, metrics: Metrics) -> None:
    """Take one sample of the database gauges."""
    async with db.read() as reader:
        started = time.perf_counter()
        await reader.one("ping", {})
        latency = time.perf_counter() - started
        queue = await reader.all("queue_depth_sample", {})
        row = await reader.one("attempts_live_count", {})
        reach = await reader.one("event_partitions_reach_sample", {})
    metrics.live_leases.set(row.count if row else 0)
    metrics.set_queue([(q.organization_id, q.state, q.tasks, q.oldest_pending_seconds) for q in queue])
    # No time partition at all: everything goes to the default partition, as if reach were 0.
    metrics.sampled(database_latency=latency, partitions_ahead=float(reach.seconds_ahead)
                    if reach and reach.seconds_ahead is not None else 0.0)
