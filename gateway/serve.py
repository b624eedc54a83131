"""Running the Gateway over HTTPS, in one or several processes (``leasehold gateway serve``).

The worker API listens with ``ssl.CERT_REQUIRED`` (mTLS, TLS 1.2+); the operator API on its
own port with server-side TLS only (operators authenticate with bearer API keys). With
``--processes N`` every process binds the same ports with SO_REUSEPORT, so the kernel spreads
connections over all cores; the processes share nothing but PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import ssl
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import Gauge

from gateway.app import create_app
from gateway.guard import ConnectionGuard
from gateway.keys import GUARDS, METRICS
from gateway.logs import configure_logging
from gateway.settings import GatewaySettings
from gateway.tls import PkiPaths, load_pki, server_ssl_context

log = logging.getLogger("leasehold.gateway")


def tls_paths(settings: GatewaySettings) -> PkiPaths:
    """Certificate paths from ``pki_dir``, with explicit files taking precedence."""
    base = load_pki(settings.pki_dir) if settings.pki_dir else None
    ca = settings.ca_file or (base.ca_cert if base else None)
    cert = settings.cert_file or (base.server_cert if base else None)
    key = settings.key_file or (base.server_key if base else None)
    if ca is None or cert is None or key is None:
        raise SystemExit("leasehold: error: set --pki-dir, or --ca-file, --cert-file and --key-file")
    return PkiPaths(directory=Path(ca).parent, ca_cert=Path(ca), ca_key=Path(ca).parent / "ca-key.pem",
                    server_cert=Path(cert), server_key=Path(key))


def operator_ssl_context(paths: PkiPaths) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile=str(paths.server_cert), keyfile=str(paths.server_key))
    return ctx


class GuardedSite(web.TCPSite):
    """A TLS listener whose connections pass through a :class:`ConnectionGuard`, with the TLS
    handshake bounded by the header timeout."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, ssl_context: ssl.SSLContext,
                 guard: ConnectionGuard, reuse_port: bool, backlog: int = 128) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context, reuse_port=reuse_port, backlog=backlog)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self.guard.factory(server), self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port,
            ssl_handshake_timeout=self.guard.header_timeout)


def _guard_metrics(app: web.Application, guards: list[ConnectionGuard]) -> None:
    registry = app[METRICS].registry
    open_ = Gauge("leasehold_connections_open", "Open connections, per listener", ["listener"], registry=registry)
    closed = Gauge("leasehold_connections_closed_by_guard", "Connections the guard closed since start, per "
                   "listener and reason (header_timeout, evicted, refused)", ["listener", "reason"], registry=registry)
    for g in guards:
        open_.labels(g.name).set_function(lambda g=g: len(g.open))  # type: ignore[misc]
        closed.labels(g.name, "header_timeout").set_function(lambda g=g: g.timed_out)  # type: ignore[misc]
        closed.labels(g.name, "evicted").set_function(lambda g=g: g.evicted)  # type: ignore[misc]
        closed.labels(g.name, "refused").set_function(lambda g=g: g.refused)  # type: ignore[misc]


async def start(settings: GatewaySettings, *, reuse_port: bool = False) -> tuple[web.AppRunner, list[int]]:
    """Start the Gateway in this event loop; returns the runner and the bound ports (worker, operator)."""
    paths = tls_paths(settings)
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, handle_signals=False,
                           keepalive_timeout=settings.keepalive_timeout_seconds)
    guards = [ConnectionGuard(name, header_timeout=settings.header_timeout_seconds,
                              max_connections=settings.max_connections_per_listener) for name in ("worker", "operator")]
    app[GUARDS] = guards
    _guard_metrics(app, guards)
    await runner.setup()
    worker_site = GuardedSite(runner, settings.host, settings.worker_port, ssl_context=server_ssl_context(paths),
                              guard=guards[0], reuse_port=reuse_port, backlog=1024)
    operator_site = GuardedSite(runner, settings.host, settings.operator_port,
                                ssl_context=operator_ssl_context(paths), guard=guards[1], reuse_port=reuse_port,
                                backlog=1024)
    await worker_site.start()
    await operator_site.start()
    ports = [s._server.sockets[0].getsockname()[1] for s in (worker_site, operator_site)]  # type: ignore[union-attr]
    return runner, ports


async def _serve_forever(settings: GatewaySettings, reuse_port: bool) -> None:
    runner, ports = await start(settings, reuse_port=reuse_port)
    log.info("gateway listening", extra={"worker_port": ports[0], "operator_port": ports[1]})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("gateway stopping")
    await runner.cleanup()


def _child(settings_json: str) -> None:
    settings = GatewaySettings.model_validate_json(settings_json)
    configure_logging(settings.log_level)
    asyncio.run(_serve_forever(settings, reuse_port=True))


def serve(settings: GatewaySettings) -> int:
    """Serve until SIGTERM/SIGINT. Returns the exit code."""
    configure_logging(settings.log_level)
    if settings.processes == 1:
        asyncio.run(_serve_forever(settings, reuse_port=False))
        return 0
    ctx = multiprocessing.get_context("spawn")
    children = [ctx.Process(target=_child, args=(settings.model_dump_json(),), name=f"gateway-{i}")
                for i in range(settings.processes)]
    for child in children:
        child.start()

    def forward(signum: int, _frame: Any) -> None:
        for child in children:
            if child.pid is not None and child.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = []
    for child in children:
        child.join()
        codes.append(child.exitcode or 0)
    return max(codes)
