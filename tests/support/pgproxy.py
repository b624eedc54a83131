"""A TCP proxy that speaks enough of PostgreSQL's wire protocol to lose a COMMIT on purpose.

It sits between a client (a Gateway's pool) and a server, forwarding bytes both ways, and reads
the messages as they pass: the client's ``Parse``/``Bind`` (which statement runs, prepared or
not) and the server's ``CommandComplete`` tags. Armed with :meth:`PgProxy.arm`, it picks the
next connection whose traffic carries a marker (bytes of a parameter: a task's or attempt's id)
and drops it at the COMMIT of that transaction:

* ``"after"``: the server has committed (its ``CommandComplete COMMIT`` arrived) and the client
  never hears of it — the ambiguous case: the write is durable, the answer lost;
* ``"before"``: the client's batch carrying the COMMIT is never forwarded, so nothing of the
  transaction commits, though the client queued its COMMIT.

Connect with ``sslmode=disable&gssencmode=disable``: the proxy reads plain protocol only.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal
from uuid import UUID

Mode = Literal["after", "before"]


@dataclass
class _Conn:
    number: int
    statements: dict[bytes, bytes] = field(default_factory=dict)  # prepared name -> query text
    targeted: bool = False
    commit_sent: bool = False


class PgProxy:
    """See the module docstring."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream_host, self.upstream_port = upstream_host, upstream_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._markers: tuple[bytes, ...] = ()
        self._mode: Mode | None = None
        self._count = 0
        self._writers: set[asyncio.StreamWriter] = set()
        #: One line per dropped connection: ``"after"`` or ``"before"``.
        self.dropped: list[str] = []

    def url(self, dbname: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}?sslmode=disable&gssencmode=disable"

    def arm(self, mode: Mode, marker: UUID | str) -> None:
        """Drop the next connection whose traffic carries ``marker``, at its COMMIT (once)."""
        text = str(marker).encode()
        self._markers = (text, marker.bytes) if isinstance(marker, UUID) else (text,)
        self._mode = mode

    @property
    def armed(self) -> bool:
        return self._mode is not None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._count += 1
        conn = _Conn(self._count)
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        tasks = [asyncio.create_task(self._client_to_server(conn, reader, up_writer, writer)),
                 asyncio.create_task(self._server_to_client(conn, up_reader, writer, up_writer))]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for w in (writer, up_writer):
            w.close()
            self._writers.discard(w)

    def _drop(self, conn: _Conn, mode: Mode) -> None:
        self.dropped.append(mode)
        self._mode = None
        conn.targeted = False

    async def _client_to_server(self, conn: _Conn, reader: asyncio.StreamReader, upstream: asyncio.StreamWriter,
                                client: asyncio.StreamWriter) -> None:
        # The startup message has no type byte: its length, then the rest.
        head = await reader.readexactly(4)
        (length,) = struct.unpack("!I", head)
        upstream.write(head + await reader.readexactly(length - 4))
        buffer = b""
        while True:
            data = await reader.read(65536)
            if not data:
                return
            buffer += data
            chunk, buffer, commits = self._client_messages(conn, buffer)
            if self._mode is not None and any(m in chunk for m in self._markers):
                conn.targeted = True
            if conn.targeted and commits:
                if self._mode == "before":
                    self._drop(conn, "before")
                    _reset(client)
                    _reset(upstream)
                    return
                conn.commit_sent = True
            upstream.write(chunk)
            await upstream.drain()

    def _client_messages(self, conn: _Conn, buffer: bytes) -> tuple[bytes, bytes, bool]:
        """The complete messages of ``buffer`` (and the rest); whether one of them runs COMMIT."""
        at, commits = 0, False
        while len(buffer) - at >= 5:
            kind = buffer[at:at + 1]
            (length,) = struct.unpack("!I", buffer[at + 1:at + 5])
            end = at + 1 + length
            if end > len(buffer):
                break
            body = buffer[at + 5:end]
            if kind == b"P":  # Parse: name, query
                name, _, rest = body.partition(b"\0")
                query = rest.partition(b"\0")[0]
                conn.statements[name] = query
                commits = commits or (name == b"" and _is_commit(query))
            elif kind == b"B":  # Bind: portal, statement
                statement = body.partition(b"\0")[2].partition(b"\0")[0]
                commits = commits or _is_commit(conn.statements.get(statement, b""))
            elif kind == b"Q":
                commits = commits or b"COMMIT" in body.upper()
            at = end
        return buffer[:at], buffer[at:], commits

    async def _server_to_client(self, conn: _Conn, reader: asyncio.StreamReader, client: asyncio.StreamWriter,
                                upstream: asyncio.StreamWriter) -> None:
        buffer = b""
        while True:
            data = await reader.read(65536)
            if not data:
                return
            buffer += data
            at = 0
            while len(buffer) - at >= 5:
                kind = buffer[at:at + 1]
                (length,) = struct.unpack("!I", buffer[at + 1:at + 5])
                end = at + 1 + length
                if end > len(buffer):
                    break
                if (kind == b"C" and buffer[at + 5:end].rstrip(b"\0") == b"COMMIT" and conn.targeted
                        and conn.commit_sent and self._mode == "after"):
                    client.write(buffer[:at])  # what came before the COMMIT's answer, not that
                    self._drop(conn, "after")
                    _reset(client)
                    _reset(upstream)
                    return
                at = end
            client.write(buffer[:at])
            buffer = buffer[at:]
            await client.drain()


def _is_commit(query: bytes) -> bool:
    return query.strip().rstrip(b";").upper() == b"COMMIT"


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (no orderly shutdown): what a dead server or network looks like."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


@asynccontextmanager
async def pg_proxy(upstream_port: int, upstream_host: str = "127.0.0.1") -> AsyncIterator[PgProxy]:
    """A started :class:`PgProxy` in front of ``upstream_host:upstream_port``."""
    proxy = PgProxy(upstream_port, upstream_host)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.aclose()
