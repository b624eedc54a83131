"""Connection hygiene of a listener: slow and idle clients cannot hold connections open.

aiohttp alone keeps a connection as long as its keep-alive timeout and has no bound on how long
a request header may take to arrive, nor on how many connections a listener holds. Each listener
of the Gateway gets a :class:`ConnectionGuard`, which wraps every connection's protocol:

* **header timeout**: the TLS handshake (``ssl_handshake_timeout`` of the listening socket), and
  then the connection's first complete request header (up to the blank line), must each arrive
  within ``header_timeout`` seconds, or the connection is aborted. Later requests on a kept-alive
  connection are bounded by aiohttp's keep-alive timer (``keepalive_timeout``): it runs from the
  end of the previous answer and data does not reset it, so the next header must be complete
  within it too, and an idle connection is closed when it expires;
* **a cap per listener**: at most ``max_connections`` open connections. A new connection at the
  cap evicts the oldest one that has not sent a complete request header yet (a slow or idle
  client); only when every connection is past that is the new one refused (closed at once).
  So slow clients are shed first, and a normal client still gets in.

The request body is bounded separately (:func:`gateway.api.http.read_json`, ``body_timeout``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("leasehold.gateway")

_END_OF_HEADER = b"\r\n\r\n"


class ConnectionGuard:
    """The guard of one listener (one per listening socket and process)."""

    def __init__(self, name: str, *, header_timeout: float, max_connections: int) -> None:
        self.name = name
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        #: Open connections, oldest first (insertion order).
        self.open: dict[GuardedProtocol, None] = {}
        self.timed_out = 0
        self.evicted = 0
        self.refused = 0

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for ``loop.create_server`` that guards ``inner``'s protocols."""
        return lambda: GuardedProtocol(self, inner())

    def admit(self, protocol: GuardedProtocol) -> bool:
        if len(self.open) >= self.max_connections:
            victim = next((p for p in self.open if not p.header_seen), None)
            if victim is None:
                self.refused += 1
                return False
            self.evicted += 1
            victim.abort()
        self.open[protocol] = None
        return True


class GuardedProtocol(asyncio.Protocol):
    """One connection: forwards everything to aiohttp's protocol, and watches for the header."""

    __slots__ = ("guard", "header_seen", "inner", "transport", "_admitted", "_tail", "_timer")

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard, self.inner = guard, inner
        self.header_seen = False
        self.transport: asyncio.BaseTransport | None = None
        self._admitted = False
        self._tail = b""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if not self.guard.admit(self):
            _abort(transport)
            return
        self._admitted = True
        self._timer = asyncio.get_running_loop().call_later(self.guard.header_timeout, self._header_late)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if not self.header_seen:
            if _END_OF_HEADER in self._tail + data:
                self.header_seen = True
                self._cancel_timer()
            else:
                self._tail = (self._tail + data)[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self._admitted else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.guard.open.pop(self, None)
        if self._admitted:
            self._admitted = False
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self.inner.resume_writing()

    def abort(self) -> None:
        if self.transport is not None:
            _abort(self.transport)

    def _header_late(self) -> None:
        self._timer = None
        if not self.header_seen:
            self.guard.timed_out += 1
            log.info("closing a connection that sent no complete request header in time",
                     extra={"listener": self.guard.name, "timeout_seconds": self.guard.header_timeout})
            self.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _abort(transport: Any) -> None:
    """Close at once (no TLS close_notify exchange a slow peer could stall)."""
    abort = getattr(transport, "abort", None)
    if abort is not None:
        abort()
    else:
        transport.close()
