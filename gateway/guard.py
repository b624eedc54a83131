"""Connection hygiene of a listener: slow and idle clients cannot hold connections open.

aiohttp alone keeps a connection as long as its keep-alive timeout and has no bound on how long
a request header may take to arrive, nor on how many connections a listener holds. Each listener
of the Gateway gets a :class:`ConnectionGuard`, which wraps every connection's protocol:

* **TLS inside the guard**: with a TLS context, the guard sees the connection from the moment it
  is accepted and starts TLS on it itself (``loop.start_tls``), so a connection still in its
  handshake counts against the cap and can be evicted like any other that has sent no request
  header yet (a flood of stalled handshakes cannot fill the process's sockets unseen);
* **header timeout**: the TLS handshake and then the connection's first complete request header
  (up to the blank line) must together arrive within ``header_timeout`` seconds of the
  connection's accept, or the connection is aborted. Later requests on a kept-alive
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
import ssl
from collections.abc import Callable
from typing import Any

log = logging.getLogger("leasehold.gateway")

_END_OF_HEADER = b"\r\n\r\n"


class ConnectionGuard:
    """The guard of one listener (one per listening socket and process)."""

    def __init__(self, name: str, *, header_timeout: float, max_connections: int,
                 tls: ssl.SSLContext | None = None) -> None:
        self.name = name
        #: The listener's TLS context: the guard starts TLS on each connection it admitted.
        self.tls = tls
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        #: Open connections, oldest first (insertion order).
        self.open: dict[GuardedProtocol, None] = {}
        self.timed_out = 0
        self.evicted = 0
        self.refused = 0
        #: Handshakes that failed or were cut short (bad certificate, timeout, peer gone).
        self.handshakes_failed = 0

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

    __slots__ = ("guard", "header_seen", "inner", "transport", "_admitted", "_connected", "_early", "_handshake",
                 "_tail", "_timer")

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard, self.inner = guard, inner
        self.header_seen = False
        #: The accepted socket's transport (under TLS, the encrypted side).
        self.transport: asyncio.BaseTransport | None = None
        self._admitted = False
        self._connected = False  # the inner protocol has its transport
        #: Data the TLS layer decrypted before start_tls returned (a client may send its request
        #: with the end of its handshake): handed on once the inner protocol has its transport.
        self._early: list[bytes] = []
        self._handshake: asyncio.Task[None] | None = None
        self._tail = b""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.transport is not None:  # start_tls hands the protocol to its TLS layer: nothing to do
            return
        self.transport = transport
        if not self.guard.admit(self):
            _abort(transport)
            return
        self._admitted = True
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.guard.header_timeout, self._header_late)
        if self.guard.tls is None:
            self._connect(transport)
            return
        # Nothing is read until the TLS layer is in place (the ClientHello must reach it).
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()
        self._handshake = loop.create_task(self._start_tls(transport))

    async def _start_tls(self, raw: asyncio.Transport) -> None:
        assert self.guard.tls is not None
        try:
            secured = await asyncio.get_running_loop().start_tls(
                raw, self, self.guard.tls, server_side=True, ssl_handshake_timeout=self.guard.header_timeout)
        except (OSError, ssl.SSLError, TimeoutError, asyncio.CancelledError, RuntimeError) as exc:
            # A refused certificate, a timeout, a peer gone: the TLS layer logged it (debug).
            self.guard.handshakes_failed += 1
            self._forget()
            _abort(raw)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if not self._admitted or secured is None:  # evicted or timed out meanwhile (None: the socket closed)
            self._forget()
            if secured is not None:
                _abort(secured)
            return
        self._connect(secured)

    def _connect(self, transport: asyncio.BaseTransport) -> None:
        self._connected = True
        self.inner.connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            if self._connected:
                self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if not self._connected:
            if self._admitted:
                self._early.append(data)
            return
        if not self.header_seen:
            if _END_OF_HEADER in self._tail + data:
                self.header_seen = True
                self._cancel_timer()
            else:
                self._tail = (self._tail + data)[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self._connected else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        if self._connected:
            self._connected = False
            self.inner.connection_lost(exc)

    def _forget(self) -> None:
        self._cancel_timer()
        self.guard.open.pop(self, None)
        self._admitted = False

    def pause_writing(self) -> None:
        if self._connected:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._connected:
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
