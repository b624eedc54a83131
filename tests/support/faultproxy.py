"""A TCP proxy on 127.0.0.1 that injects network faults between a worker and the Gateway.

It works below TLS: bytes pass through untouched, so the worker still verifies the Gateway's
certificate (connect to ``https://localhost:<proxy port>``) and the Gateway still sees the
worker's client certificate. Faults:

* ``PASS`` — forward both ways;
* ``BLACKHOLE`` — accept, but never forward (the client waits until its own timeout);
* ``PARTITION`` — nothing moves either way, and nothing is lost: bytes wait (as TCP keeps
  retransmitting them) until the partition heals (``proxy.mode = Fault.PASS``), then flow on,
  late. New connections wait too. A request sent during the partition reaches the upstream
  after it, even when the client has given up meanwhile;
* ``RESET`` — close the client's connection with a TCP reset;
* ``DROP_RESPONSE`` — forward the request, let the upstream answer, then close the client's
  connection without passing the answer on (the request *was* processed; the client cannot know).

Two ways to apply them:

* ``proxy.mode = Fault.BLACKHOLE`` (or ``RESET``, ``PARTITION``): an outage for every
  connection, new and open, until ``proxy.mode = Fault.PASS``;
* rules for single requests: ``proxy.add_rule(Fault.DROP_RESPONSE, nth=1)`` — the first request
  from now on; ``when=flag.is_set`` — requests while a flag is set; ``times=1`` — at most once.
  The conditions combine; ``nth`` counts the requests that pass ``when``.

Requests are found without decrypting anything: after a connection's TLS handshake (its end is
recognised by the client's Finished record: TLS 1.3 ``Finished`` has a fixed record length, TLS
1.2 sends it right after ChangeCipherSpec), a request is a run of client application-data records
that starts after the server last spoke. That is exact for HTTP/1.1 without pipelining, which is
what the worker speaks. A request's fault is chosen at its first byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

__all__ = ["Fault", "FaultProxy", "ProxiedRequest", "Rule", "fault_proxy"]

# TLS record content types.
_CHANGE_CIPHER_SPEC, _ALERT, _HANDSHAKE, _APPLICATION_DATA = 20, 21, 22, 23
# TLS 1.3 Finished as a record: 4 (header) + hash (32 or 48) + 1 (inner type) + 16 (AEAD tag).
_TLS13_FINISHED_RECORD_LENGTHS = frozenset({53, 69})


class Fault(enum.Enum):
    PASS = "pass"
    BLACKHOLE = "blackhole"
    PARTITION = "partition"
    RESET = "reset"
    DROP_RESPONSE = "drop_response"


@dataclass
class Rule:
    """Apply ``fault`` to the requests that meet every condition given."""

    fault: Fault
    nth: int | None = None
    when: Callable[[], bool] | None = None
    times: int | None = None
    seen: int = 0
    hits: int = 0
    hit: asyncio.Event = field(default_factory=asyncio.Event)

    def applies(self) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.when is not None and not self.when():
            return False
        self.seen += 1
        if self.nth is not None and self.seen != self.nth:
            return False
        self.hits += 1
        self.hit.set()
        return True

    async def wait(self, seconds: float = 10.0) -> None:
        """Until the rule has applied to a request (at most ``seconds``)."""
        await asyncio.wait_for(self.hit.wait(), seconds)


@dataclass
class ProxiedRequest:
    connection: int
    number: int  # 1-based, over the proxy's lifetime
    fault: Fault
    answered: bool = False  # the upstream answered (for DROP_RESPONSE: the answer was dropped)


class _TlsRecords:
    """Splits one direction of a TLS stream into (record type, bytes) pieces as they arrive."""

    def __init__(self) -> None:
        self._header = b""
        self._left = 0
        self._type = 0
        self.length = 0

    def feed(self, data: bytes) -> list[tuple[int, bool, bool, bytes]]:
        """Pieces of ``data``: (record type, starts a record, ends a record, bytes). The bytes of
        an incomplete record header are held back until the header is complete."""
        pieces: list[tuple[int, bool, bool, bytes]] = []
        i = 0
        while i < len(data):
            if self._left == 0:
                chunk = data[i:i + 5 - len(self._header)]
                self._header += chunk
                i += len(chunk)
                if len(self._header) < 5:
                    break
                self._type = self._header[0]
                self.length = self._left = struct.unpack(">H", self._header[3:5])[0]
                head, self._header = self._header, b""
                take = data[i:i + self._left]
                i += len(take)
                self._left -= len(take)
                pieces.append((self._type, True, self._left == 0, head + take))
            else:
                take = data[i:i + self._left]
                i += len(take)
                self._left -= len(take)
                pieces.append((self._type, False, self._left == 0, take))
        return pieces


class _Connection:
    def __init__(self, number: int) -> None:
        self.number = number
        self.client_records = _TlsRecords()
        self.handshake_done = False
        self.saw_ccs = False
        self.expect_request = True
        self.request: ProxiedRequest | None = None
        self.dead = False  # blackholed: nothing more is forwarded either way
        self.settle: asyncio.TimerHandle | None = None


class FaultProxy:
    """See the module docstring. Use as ``async with fault_proxy(port) as proxy``."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1", *, settle_seconds: float = 0.2) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.settle_seconds = settle_seconds
        self._flowing = asyncio.Event()  # clear while partitioned
        self.mode = Fault.PASS
        self.rules: list[Rule] = []
        self.requests: list[ProxiedRequest] = []
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def mode(self) -> Fault:
        """The outage applied to every connection (``PASS``: none)."""
        return self._mode

    @mode.setter
    def mode(self, fault: Fault) -> None:
        self._mode = fault
        if fault is Fault.PARTITION:
            self._flowing.clear()
        else:
            self._flowing.set()

    def url(self, host: str = "localhost") -> str:
        return f"https://{host}:{self.port}"

    def add_rule(self, fault: Fault, *, nth: int | None = None, when: Callable[[], bool] | None = None,
                 times: int | None = None) -> Rule:
        rule = Rule(fault, nth=nth, when=when, times=times)
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Back to passing everything through."""
        self.rules.clear()
        self.mode = Fault.PASS

    def faulted(self, fault: Fault) -> list[ProxiedRequest]:
        return [r for r in self.requests if r.fault is fault]

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    # --- connections ---------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        conn = _Connection(self.connections)
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            if self.mode is Fault.RESET:
                _reset(writer)
                return
            if self.mode is Fault.BLACKHOLE:
                while await reader.read(65536):
                    pass
                return
            await self._flowing.wait()  # a partition holds new connections until it heals
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
            self._writers.add(upstream_writer)
            pumps = [asyncio.create_task(self._client_to_server(conn, reader, upstream_writer, writer)),
                     asyncio.create_task(self._server_to_client(conn, upstream_reader, writer, upstream_writer))]
            try:
                await asyncio.gather(*pumps)
            finally:
                for pump in pumps:
                    pump.cancel()
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            pass  # the proxy is closing; this task is its own top level (asyncio would log it)
        finally:
            if conn.settle is not None:
                conn.settle.cancel()
            for w in (writer, upstream_writer):
                if w is not None:
                    self._writers.discard(w)
                    w.close()
            self._tasks.discard(task)

    async def _client_to_server(self, conn: _Connection, reader: asyncio.StreamReader,
                                upstream: asyncio.StreamWriter, client: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            await self._flowing.wait()
            if self._outage(conn, client, upstream):
                continue
            out = bytearray()
            for record_type, starts, ends, piece in conn.client_records.feed(data):
                fault = self._classify_client_record(conn, record_type, starts)
                if fault is Fault.RESET:
                    _reset(client)
                    upstream.transport.abort()
                    return
                if fault is Fault.BLACKHOLE or conn.dead:
                    conn.dead = True
                    continue
                out += piece
                if ends:
                    self._after_client_record(conn, record_type)
            if out:
                upstream.write(bytes(out))
                await upstream.drain()
        if not conn.dead:
            with contextlib.suppress(OSError, RuntimeError):
                upstream.write_eof()

    def _classify_client_record(self, conn: _Connection, record_type: int, starts: bool) -> Fault:
        """The fault for this piece of a client record (decided at a request's first record)."""
        if not conn.handshake_done or record_type != _APPLICATION_DATA:
            return Fault.PASS
        if starts and conn.expect_request:
            conn.expect_request = False
            fault = Fault.PASS
            for rule in self.rules:
                if rule.applies():
                    fault = rule.fault
                    break
            conn.request = ProxiedRequest(conn.number, len(self.requests) + 1, fault)
            self.requests.append(conn.request)
        return conn.request.fault if conn.request is not None else Fault.PASS

    def _after_client_record(self, conn: _Connection, record_type: int) -> None:
        if conn.handshake_done:
            return
        length = conn.client_records.length
        if record_type == _CHANGE_CIPHER_SPEC:
            conn.saw_ccs = True
        elif record_type == _HANDSHAKE and conn.saw_ccs:  # TLS 1.2: Finished follows ChangeCipherSpec
            conn.handshake_done = True
        elif record_type == _APPLICATION_DATA and length in _TLS13_FINISHED_RECORD_LENGTHS:
            conn.handshake_done = True  # TLS 1.3: the client's Finished

    async def _server_to_client(self, conn: _Connection, reader: asyncio.StreamReader,
                                client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            await self._flowing.wait()
            if self._outage(conn, client, upstream) or conn.dead:
                continue
            request = conn.request
            if conn.handshake_done and request is not None and not conn.expect_request:
                request.answered = True
            if conn.handshake_done:
                conn.expect_request = True  # the next client application data is a new request
            if request is not None and request.fault is Fault.DROP_RESPONSE:
                # Swallow the answer; close the client once the upstream has been quiet a moment.
                if conn.settle is not None:
                    conn.settle.cancel()
                conn.settle = asyncio.get_running_loop().call_later(
                    self.settle_seconds, _close_both, client, upstream)
                continue
            client.write(data)
            await client.drain()
        with contextlib.suppress(OSError, RuntimeError):
            if conn.settle is None:
                client.write_eof()

    def _outage(self, conn: _Connection, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> bool:
        """Apply :attr:`mode` to an open connection; True when the data must not be forwarded."""
        if self.mode is Fault.RESET:
            _reset(client)
            upstream.transport.abort()
            return True
        if self.mode is Fault.BLACKHOLE:
            conn.dead = True
            return True
        return False


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0) rather than a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _close_both(client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
    client.transport.abort()
    upstream.transport.abort()


@asynccontextmanager
async def fault_proxy(upstream_port: int, upstream_host: str = "127.0.0.1",
                      **options: float) -> AsyncIterator[FaultProxy]:
    """A started :class:`FaultProxy` in front of ``upstream_host:upstream_port``."""
    proxy = FaultProxy(upstream_port, upstream_host, **options)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.aclose()
