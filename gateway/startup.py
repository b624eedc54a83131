"""What the Gateway checks before it serves, each failure one clear line.

:class:`StartupError` carries that line; ``leasehold gateway serve`` prints it on stderr and exits
1 within seconds. The checks: the TLS material loads (the server key matches its certificate,
the CA bundle reads), both ports can be bound, the database answers within
:data:`CONNECT_TIMEOUT_SECONDS`, and its schema is at the revision this Gateway was built for
(:mod:`gateway.schema`).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import psycopg

from leasehold.gateway.schema import read_revision_async, status_of
from leasehold.gateway.settings import GatewaySettings
from leasehold.gateway.tls import PkiError, PkiPaths, load_pki, server_ssl_context
from leasehold.persistence.urls import database_label

__all__ = ["CONNECT_TIMEOUT_SECONDS", "Listeners", "StartupError", "bind", "check_database", "check_databases",
           "operator_ssl_context", "tls_contexts", "tls_paths"]

#: How long the start-up check waits for the database to answer.
CONNECT_TIMEOUT_SECONDS = 5


class StartupError(Exception):
    """The Gateway cannot start; the message says why, in one line."""


def tls_paths(settings: GatewaySettings) -> PkiPaths:
    """Certificate paths from ``pki_dir``, with explicit files taking precedence."""
    try:
        base = load_pki(settings.pki_dir) if settings.pki_dir else None
    except PkiError as exc:
        raise StartupError(f"TLS: {exc}") from exc
    ca = settings.ca_file or (base.ca_cert if base else None)
    cert = settings.cert_file or (base.server_cert if base else None)
    key = settings.key_file or (base.server_key if base else None)
    if ca is None or cert is None or key is None:
        raise StartupError("TLS: set --pki-dir, or all of --ca-file, --cert-file and --key-file")
    return PkiPaths(directory=Path(ca).parent, ca_cert=Path(ca), ca_key=Path(ca).parent / "ca-key.pem",
                    server_cert=Path(cert), server_key=Path(key))


def operator_ssl_context(paths: PkiPaths) -> ssl.SSLContext:
    """The operator port's context: server-side TLS only (operators authenticate with API keys)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile=str(paths.server_cert), keyfile=str(paths.server_key))
    return ctx


def check_secrets(settings: GatewaySettings) -> None:
    """The bootstrap key file, when given, must be readable and not empty."""
    path = settings.admin_api_key_file
    if path is None:
        return
    try:
        key = settings.bootstrap_key()
    except OSError as exc:
        raise StartupError(f"cannot read --admin-api-key-file {path}: {exc.strerror or exc}") from exc
    if not key:
        raise StartupError(f"--admin-api-key-file {path} is empty")


def tls_contexts(settings: GatewaySettings) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The worker (mTLS) and operator (server TLS) contexts, or a :class:`StartupError` naming
    the file at fault."""
    check_secrets(settings)
    paths = tls_paths(settings)
    for path in (paths.server_cert, paths.server_key, paths.ca_cert):
        if not path.is_file():
            raise StartupError(f"TLS: no such file: {path}")
    try:
        return server_ssl_context(paths), operator_ssl_context(paths)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise StartupError(f"TLS: the server key {paths.server_key} does not match the certificate "
                               f"{paths.server_cert}") from exc
        raise StartupError(f"TLS: cannot load the certificate {paths.server_cert}, its key {paths.server_key} "
                           f"or the CA {paths.ca_cert}: {exc.reason or exc}") from exc
    except OSError as exc:
        raise StartupError(f"TLS: cannot read {exc.filename or paths.directory}: {exc.strerror or exc}") from exc


@dataclass
class Listeners:
    """The bound, listening sockets: worker, operator and (optional) health port."""

    worker: socket.socket
    operator: socket.socket
    health: socket.socket | None = None

    @property
    def ports(self) -> tuple[int, int]:
        return _port(self.worker), _port(self.operator)

    def by_port(self) -> dict[int, str]:
        """Local port -> listener name."""
        found = {_port(self.worker): "worker", _port(self.operator): "operator"}
        if self.health is not None:
            found[_port(self.health)] = "health"
        return found

    def close(self) -> None:
        for sock in (self.worker, self.operator, self.health):
            if sock is None:
                continue
            with contextlib.suppress(OSError):
                sock.close()


def _port(sock: socket.socket) -> int:
    """The local port of a bound socket (its address is (host, port) or, IPv6, four fields)."""
    _host, port, *_ = sock.getsockname()
    return int(port)


def _listen(host: str, port: int, what: str, *, reuse_port: bool) -> socket.socket:
    try:
        family, kind, proto, _, address = next(iter(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                       flags=socket.AI_PASSIVE)))
    except socket.gaierror as exc:
        raise StartupError(f"cannot listen on {host!r} ({what} port): {exc.strerror}") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port} ({what} port): {exc.strerror or exc}") from exc
    sock.setblocking(False)
    return sock


def bind(settings: GatewaySettings, *, reuse_port: bool = False) -> Listeners:
    """Bind and listen on the worker, operator and health ports (a port in use is a
    :class:`StartupError`, and nothing stays bound)."""
    bound: list[socket.socket] = []
    wanted = [(settings.worker_port, "worker"), (settings.operator_port, "operator")]
    if settings.health_port is not None:
        wanted.append((settings.health_port, "health"))
    try:
        for port, what in wanted:
            bound.append(_listen(settings.host, port, what, reuse_port=reuse_port))
    except StartupError:
        for sock in bound:
            sock.close()
        raise
    worker, operator, *health = bound
    return Listeners(worker, operator, next(iter(health), None))


async def check_database(url: str, what: str = "database") -> str | None:
    """Connect once and read the schema revision: unreachable, refusing or at another revision
    than this Gateway's is a :class:`StartupError`. Returns the revision."""
    label = database_label(url)
    # The read and notify databases are named as such: their URL may look like the primary's.
    named = label if what == "database" else f"the {what} at {label}"
    try:
        conn = await psycopg.AsyncConnection.connect(url, connect_timeout=CONNECT_TIMEOUT_SECONDS, autocommit=True)
    except psycopg.ProgrammingError as exc:
        raise StartupError(f"invalid {what} URL for {label}: {_first_line(exc)}") from exc
    except psycopg.Error as exc:
        raise StartupError(f"cannot connect to the {what} at {label}: {_first_line(exc)}") from exc
    try:
        found = await read_revision_async(conn)
    except psycopg.Error as exc:
        raise StartupError(f"cannot read the schema revision of {named}: {_first_line(exc)}") from exc
    finally:
        await conn.close()
    status = status_of(found)
    problem = status.problem()
    if problem is not None:
        raise StartupError(f"{named}: {problem}")
    return status.found


async def check_databases(settings: GatewaySettings) -> None:
    """:func:`check_database` on the database, then on the read database (a replica must be at
    this Gateway's revision too) and the notify database when they are set."""
    await check_database(settings.resolved_database_url())
    for url, what in ((settings.read_database_url, "read database"), (settings.notify_database_url, "notify database")):
        if url:
            await check_database(url, what)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return next(iter(text.splitlines()), type(exc).__name__)
