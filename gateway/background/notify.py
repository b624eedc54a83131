"""Long-poll wake-ups: PostgreSQL LISTEN/NOTIFY, with the wait room's sweep as the safety net.

Commands that make work available (a new task) or ask a worker to stop (a cancel) send
``pg_notify('leasehold', topic)`` inside their transaction (:mod:`gateway.commands.wakeups`), so the notification is delivered only
if, and when, the change commits — to every Gateway process and replica listening. Each process
keeps one listening connection; waiting acquires park in its wait room
(:mod:`gateway.background.waitroom`), whose one sweep per process bounds what a lost
notification costs (``wake_sweep_seconds``), never correctness. While the listening connection
is down, waiting acquires re-poll every ``poll_interval_seconds`` instead. A lost listening
connection (a database restart) is re-established with backoff (0.2 s doubling to 2 s), then
every waiter re-checks. With Redis configured, the same topics also travel as
hints (:mod:`gateway.background.hints`), which wake waiters through :meth:`Notifier.dispatch` as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from leasehold.gateway.background.waitroom import WaitRoom
from leasehold.persistence.listening import listening

log = logging.getLogger("leasehold.notify")

class Notifier:
    """The process's one LISTEN connection; what it receives wakes the parked long-polls of
    :attr:`room` (:mod:`gateway.background.waitroom`)."""

    def __init__(self, url: str, *, max_backoff: float = 2.0, room: WaitRoom | None = None) -> None:
        self.url = url
        self.max_backoff = max_backoff
        self.room = room if room is not None else WaitRoom()
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self.received = 0
        #: Times the listening connection came back after being lost.
        self.reconnects = 0
        #: Called (and awaited) each time the listening connection is back after a loss: the
        #: database may have restarted, so the application can check its other connections.
        self.on_reconnect: Callable[[], Awaitable[None]] | None = None

    @property
    def closed(self) -> bool:
        """Set when the Gateway stops: waiters are woken and long-polls answer at once."""
        return self.room.closed

    @property
    def waiting(self) -> int:
        """Long-polls waiting right now."""
        return self.room.waiting

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="leasehold-listen")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _listen(self) -> None:
        backoff = 0.2
        lost = False
        while True:
            try:
                async with listening(self.url) as payloads:
                    self.connected.set()
                    backoff = 0.2
                    if lost:
                        lost = False
                        self.reconnects += 1
                        log.info("listen connection re-established")
                        if self.on_reconnect is not None:
                            await self._run_on_reconnect()
                    # A reconnect may have missed notifications: wake everyone to re-check.
                    self.room.wake_all()
                    async for payload in payloads:
                        self.received += 1
                        self.dispatch(payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database went away: poll covers until we are back
                self.connected.clear()
                if not lost:  # once per outage, not once per attempt
                    lost = True
                    log.warning("listen connection lost; long-polls fall back to polling until it is back",
                                extra={"error": str(exc)})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)

    async def _run_on_reconnect(self) -> None:
        assert self.on_reconnect is not None
        try:
            await self.on_reconnect()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reconnect hook failed")

    def dispatch(self, payload: str) -> None:
        self.room.dispatch(payload)

    def close(self) -> None:
        """The Gateway is stopping: wake every waiter; later waits return at once."""
        self.room.close()
