"""Running the Gateway over HTTPS (``leasehold gateway serve``).

The worker API listens with ``ssl.CERT_REQUIRED`` (mTLS, TLS 1.2+); the operator API on its
own port with server-side TLS only (operators authenticate with bearer API keys).

**Start-up fails fast.** Before serving, the TLS material is loaded, both ports are bound, the
database is reached and its schema revision checked (:mod:`gateway.startup`); any failure is one
line on stderr and exit code 1, within seconds, with nothing left running.

**Stopping.** On SIGTERM or SIGINT the Gateway stops accepting connections, answers every
waiting acquire long-poll at once (204, the worker asks again elsewhere), lets in-flight
requests finish for up to ``shutdown_timeout_seconds`` (default 10; cancelled after that), stops
its background loops, closes its pool, logs ``stopped`` and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import ssl
import sys
import time
from typing import Any

from aiohttp import web

from gateway.app import create_app
from gateway.keys import LISTENER_PORTS
from gateway.logs import configure_logging
from gateway.settings import GatewaySettings
from gateway.startup import Listeners, StartupError, bind, tls_contexts, tls_paths

__all__ = ["EXIT_STARTUP", "StartupError", "serve", "start", "tls_paths"]

log = logging.getLogger("leasehold.gateway")

#: Exit code of a Gateway that could not start (bad TLS material, port in use, database…).
EXIT_STARTUP = 1


async def start(settings: GatewaySettings, *, reuse_port: bool = False,
                listeners: Listeners | None = None) -> tuple[web.AppRunner, list[int]]:
    """Start the Gateway in this event loop; returns the runner and the bound ports (worker,
    operator). Raises :class:`StartupError` (after releasing whatever it took) when it cannot."""
    worker_tls, operator_tls = tls_contexts(settings)
    if listeners is None:
        listeners = bind(settings, reuse_port=reuse_port)
    app = create_app(settings)
    app[LISTENER_PORTS] = listeners.by_port()
    runner = web.AppRunner(app, access_log=None, handle_signals=False,
                           shutdown_timeout=settings.shutdown_timeout_seconds)
    try:
        await runner.setup()
        sites: list[tuple[socket.socket, ssl.SSLContext | None]] = [
            (listeners.worker, worker_tls), (listeners.operator, operator_tls)]
        if listeners.health is not None:
            sites.append((listeners.health, None))  # plain HTTP: /healthz and /readyz only
        for sock, context in sites:
            await web.SockSite(runner, sock, ssl_context=context, backlog=1024).start()
    except BaseException:
        await runner.cleanup()
        listeners.close()
        raise
    return runner, list(listeners.ports)


async def _serve_forever(settings: GatewaySettings, reuse_port: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner, ports = await start(settings, reuse_port=reuse_port)
    log.info("gateway listening", extra={"host": settings.host, "worker_port": ports[0], "operator_port": ports[1],
                                         "health_port": settings.health_port})
    await stop.wait()
    started = time.monotonic()
    log.info("gateway stopping: no new connections, waiting long-polls answered, in-flight requests finishing",
             extra={"shutdown_timeout_seconds": settings.shutdown_timeout_seconds})
    await runner.cleanup()
    log.info("stopped", extra={"seconds": round(time.monotonic() - started, 3)})


def _run(settings: GatewaySettings, reuse_port: bool) -> int:
    """One serving process: its exit code (1 when it could not start, after one line on stderr)."""
    try:
        asyncio.run(_serve_forever(settings, reuse_port))
    except StartupError as exc:
        print(f"leasehold: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_STARTUP
    return 0


def _child(settings_json: str) -> None:
    settings = GatewaySettings.model_validate_json(settings_json)
    configure_logging(settings.log_level)
    sys.exit(_run(settings, reuse_port=True))


def serve(settings: GatewaySettings) -> int:
    """Serve until SIGTERM/SIGINT. Returns the exit code."""
    configure_logging(settings.log_level)
    if settings.processes == 1:
        return _run(settings, reuse_port=False)
    # Check what can be checked once, so that N children do not print the same error N times.
    try:
        tls_contexts(settings)
        bind(settings, reuse_port=True).close()
    except StartupError as exc:
        print(f"leasehold: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_STARTUP
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
