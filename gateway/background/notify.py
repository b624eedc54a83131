"""Long-poll wake-ups: PostgreSQL LISTEN/NOTIFY, with a bounded poll as the safety net.

Commands that make work available (a new task) or ask a worker to stop (a cancel) send
``pg_notify('leasehold', topic)`` inside their transaction (:mod:`gateway.commands.wakeups`), so the notification is delivered only
if, and when, the change commits — to every Gateway process and replica listening. Each process
keeps one listening connection; waiting acquires wait on :class:`Notifier` with a timeout, so a
lost notification (or a lost connection) costs at most one poll interval, never correctness.
A lost listening connection (a database restart) is re-established with backoff (0.2 s doubling
to 2 s), then every waiter re-checks. With Redis configured, the same topics also travel as
hints (:mod:`gateway.background.hints`), which wake waiters through :meth:`Notifier.dispatch` as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from leasehold.persistence.listening import listening

log = logging.getLogger("leasehold.notify")

class Notifier:
    """Fans notifications out to waiters in this process."""

    def __init__(self, url: str, *, max_backoff: float = 2.0) -> None:
        self.url = url
        self.max_backoff = max_backoff
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self.received = 0
        #: Long-polls waiting right now.
        self.waiting = 0
        #: Set when the Gateway stops: waiters are woken and long-polls answer at once.
        self.closed = False
        #: Times the listening connection came back after being lost.
        self.reconnects = 0
        #: Called (and awaited) each time the listening connection is back after a loss: the
        #: database may have restarted, so the application can check its other connections.
        self.on_reconnect: Callable[[], Awaitable[None]] | None = None

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
                    self._wake_all()
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
        for event in self._waiters.get(payload, ()):
            event.set()

    def _wake_all(self) -> None:
        for events in self._waiters.values():
            for event in events:
                event.set()

    def close(self) -> None:
        """The Gateway is stopping: wake every waiter; later waits return at once."""
        self.closed = True
        self._wake_all()

    async def wait(self, topics: list[str], seconds: float) -> bool:
        """Wait until one of ``topics`` is notified or ``seconds`` pass; True when notified.
        Returns False at once once :meth:`close` was called."""
        if self.closed:
            return False
        event = asyncio.Event()
        for topic in topics:
            self._waiters.setdefault(topic, set()).add(event)
        self.waiting += 1
        try:
            await asyncio.wait_for(event.wait(), seconds)
            return True
        except TimeoutError:
            return False
        finally:
            self.waiting -= 1
            for topic in topics:
                waiters = self._waiters.get(topic)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[topic]
