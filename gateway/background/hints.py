"""Optional Redis wake-up hints, beside PostgreSQL LISTEN/NOTIFY (:mod:`gateway.background.notify`).

With ``redis_url`` set, every topic a committed transaction NOTIFYs (a task became available to
an organisation, a worker's task is to be cancelled) is also published on the Redis channel
:data:`CHANNEL` after the commit, and every Gateway process subscribes to it and wakes its local
waiters exactly as a NOTIFY would. A hint is only a hint: a woken waiter re-runs its acquire
query, so a late, lost, duplicated or spurious hint costs one query at most.

Redis is never on a request's path. The database's ``on_commit`` hook
(:class:`persistence.transaction.Database`) hands :meth:`Hints.publish` the topics of each
committed transaction, and a background task publishes them with a short timeout.
When Redis is down or absent nothing fails and nothing waits: hints are dropped, the outage is
logged once (not per request), both sides reconnect with backoff, and NOTIFY plus the bounded
poll still deliver every wake-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger("leasehold.hints")

CHANNEL = "leasehold:hints"
#: Largest hint message accepted from the channel (topics are ~50 bytes each).
MAX_MESSAGE_BYTES = 1 << 20


class Hints:
    """Publishes this process's wake-up topics to Redis and wakes local waiters on the topics
    any process publishes (``dispatch``: :meth:`gateway.background.notify.Notifier.dispatch`)."""

    def __init__(self, url: str, dispatch: Callable[[str], None], *, timeout: float = 0.5,
                 initial_backoff: float = 0.2, max_backoff: float = 5.0, queue_size: int = 10_000,
                 registry: CollectorRegistry | None = None) -> None:
        self.url, self.dispatch, self.timeout = url, dispatch, timeout
        self.initial_backoff, self.max_backoff = initial_backoff, max_backoff
        self._queue: asyncio.Queue[list[str]] = asyncio.Queue(queue_size)
        self._tasks: list[asyncio.Task[None]] = []
        self._publisher_ok = True  # until a publish fails
        self._subscriber_ok = False  # until subscribed
        self._outage = False
        self.published = Counter("leasehold_hints_published_total", "Redis hint messages published",
                                 registry=registry)
        self.received = Counter("leasehold_hints_received_total", "Redis hint messages received",
                                registry=registry)
        self.dropped = Counter("leasehold_hints_dropped_total",
                               "Wake-up topics not published (Redis unavailable or queue full)", registry=registry)
        Gauge("leasehold_redis_connected", "1 while this process publishes to and subscribes on Redis",
              registry=registry).set_function(lambda: 1 if self.connected else 0)

    @property
    def connected(self) -> bool:
        return self._publisher_ok and self._subscriber_ok

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._publish_loop(), name="leasehold-hints-publish"),
                       asyncio.create_task(self._subscribe_loop(), name="leasehold-hints-subscribe")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- publishing ----------------------------------------------------------------------------

    def publish(self, topics: Iterable[str]) -> None:
        """Queue topics for publishing; never blocks, never raises (a full queue drops them)."""
        batch = list(topics)
        if not batch:
            return
        try:
            self._queue.put_nowait(batch)
        except asyncio.QueueFull:
            self.dropped.inc(len(batch))

    def _take_queued(self, first: list[str]) -> set[str]:
        topics = set(first)
        while not self._queue.empty():
            topics.update(self._queue.get_nowait())
        return topics

    async def _publish_loop(self) -> None:
        client = self._client()
        backoff = self.initial_backoff
        try:
            while True:
                topics = self._take_queued(await self._queue.get())
                try:
                    async with asyncio.timeout(self.timeout):
                        await client.publish(CHANNEL, "\n".join(sorted(topics)))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self._publisher_ok = False
                    self._went_down(exc)
                    self.dropped.inc(len(topics))
                    # A hint is worth something only now: drop what queues up while we wait.
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    self.dropped.inc(len(self._take_queued([])))
                else:
                    self.published.inc()
                    backoff = self.initial_backoff
                    self._publisher_ok = True
                    self._maybe_back()
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()

    # --- subscribing ---------------------------------------------------------------------------

    async def _subscribe_loop(self) -> None:
        backoff = self.initial_backoff
        while True:
            client = self._client()
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                async with asyncio.timeout(self.timeout):
                    await pubsub.subscribe(CHANNEL)
                self._subscriber_ok = True
                backoff = self.initial_backoff
                self._maybe_back()
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
                    if message is not None and message.get("type") == "message":
                        self._on_message(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._subscriber_ok = False
                self._went_down(exc)
            finally:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(self.timeout):
                        await pubsub.aclose()
                        await client.aclose()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff)

    def _on_message(self, data: object) -> None:
        if not isinstance(data, bytes | str) or len(data) > MAX_MESSAGE_BYTES:
            return
        self.received.inc()
        text = data.decode(errors="replace") if isinstance(data, bytes) else data
        for topic in text.split("\n"):
            if topic:
                self.dispatch(topic)

    # --- state -----------------------------------------------------------------------------------

    def _client(self) -> Redis:
        # No retries inside redis-py (one reconnect for a connection that died while idle):
        # the loops here own the backoff, and the timeout bounds every call.
        return Redis.from_url(self.url, socket_connect_timeout=self.timeout, socket_timeout=None,
                              retry=Retry(NoBackoff(), 1), health_check_interval=0)

    def _went_down(self, exc: BaseException) -> None:
        if not self._outage:
            self._outage = True
            log.warning("redis unavailable: wake-up hints paused (NOTIFY and polling still wake workers)",
                        extra={"redis": redact(self.url), "error": f"{type(exc).__name__}: {exc}"})

    def _maybe_back(self) -> None:
        if self._outage and self.connected:
            self._outage = False
            log.info("redis reachable again: wake-up hints resumed", extra={"redis": redact(self.url)})


def redact(url: str) -> str:
    """The URL without its credentials (for logs)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"
