"""The presence publisher of a Gateway process: every ``presence_publish_seconds``, the workers
seen since the last pass go to ``worker_presence`` in one statement (none when none changed)."""

from __future__ import annotations

from collections.abc import Callable

from leasehold.gateway.background.loops import every
from leasehold.gateway.presence import Presence
from leasehold.persistence import presence as stored
from leasehold.persistence.transaction import Database


async def publish(db: Database, presence: Presence, *, on_publish: Callable[[int], None] | None = None) -> int:
    """Publish the changed workers now; how many were sent (0: nothing changed, no statement).
    A failed publish gives them back for the next pass and raises."""
    if not presence.changed:
        return 0
    published = presence.take()
    try:
        async with db.connection() as conn:
            await stored.publish(conn, published.worker_ids, published.ages)
    except BaseException:
        presence.give_back(published)
        raise
    if on_publish is not None:
        on_publish(len(published))
    return len(published)


async def run(db: Database, presence: Presence, interval: float, *,
              on_publish: Callable[[int], None] | None = None, on_pass: Callable[[], None] | None = None) -> None:
    """Publish every ``interval`` seconds until cancelled (an outage keeps the changes for later);
    ``on_pass`` after every pass that did not fail, a publish or not."""

    async def step() -> int:
        published = await publish(db, presence, on_publish=on_publish)
        if on_pass is not None:
            on_pass()
        return published

    await every(interval, step, name="presence")
