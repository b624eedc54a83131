"""Running the Gateway over HTTPS (``leasehold gateway serve``).

The worker API listens with ``ssl.CERT_REQUIRED`` (mTLS, TLS 1.2+); the operator API on its
own port with server-side TLS only (operators authenticate with bearer API keys).

**Start-up fails fast.** Before serving, the TLS material is loaded, both ports are bound, the
database is reached and its schema revision checked (:mod:`gateway.startup`); any failure is one
line on stderr and exit code 1, within seconds, with nothing left running.

**Several processes** (``--processes N``): :class:`Supervisor` runs N serving processes on the
same ports (SO_REUSEPORT) and restarts one that dies.

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
import multiprocessing.connection
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import time
from typing import Any

from aiohttp import web
from prometheus_client import Gauge

from leasehold.gateway.app import create_app
from leasehold.gateway.guard import ConnectionGuard
from leasehold.gateway.keys import GUARDS, LISTENER_PORTS, METRICS
from leasehold.gateway.logs import configure_logging
from leasehold.gateway.metrics import MULTIPROCESS_ENV
from leasehold.gateway.settings import GatewaySettings
from leasehold.gateway.startup import Listeners, StartupError, bind, check_databases, tls_contexts, tls_paths
from leasehold.protocol import tracing

__all__ = ["EXIT_STARTUP", "StartupError", "serve", "start", "tls_paths"]

log = logging.getLogger("leasehold.gateway")

#: Exit code of a Gateway that could not start (bad TLS material, port in use, database…).
EXIT_STARTUP = 1


class GuardedSockSite(web.SockSite):
    """A listener on a bound socket whose connections pass through a :class:`ConnectionGuard`
    (with TLS: started by the guard on each connection it admitted, the handshake bounded by the
    header timeout)."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, *, ssl_context: ssl.SSLContext | None,
                 guard: ConnectionGuard, backlog: int = 128) -> None:
        super().__init__(runner, sock, ssl_context=ssl_context, backlog=backlog)
        self.guard = guard
        guard.tls = ssl_context

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner
        server = self._runner.server
        assert server is not None
        # No ssl= here: the guard starts TLS on each connection it admitted (see gateway.guard).
        self._server = await asyncio.get_running_loop().create_server(
            self.guard.factory(server), sock=self._sock, backlog=self._backlog)


def _guard_metrics(app: web.Application, guards: list[ConnectionGuard]) -> None:
    registry = app[METRICS].registry
    open_ = Gauge("leasehold_connections_open", "Open connections, per listener", ["listener"], registry=registry)
    closed = Gauge("leasehold_connections_closed_by_guard", "Connections the guard closed since start, per "
                   "listener and reason (header_timeout, evicted, refused, handshake_failed)", ["listener", "reason"], registry=registry)
    for g in guards:
        open_.labels(g.name).set_function(lambda g=g: len(g.open))  # type: ignore[misc]
        closed.labels(g.name, "header_timeout").set_function(lambda g=g: g.timed_out)  # type: ignore[misc]
        closed.labels(g.name, "evicted").set_function(lambda g=g: g.evicted)  # type: ignore[misc]
        closed.labels(g.name, "refused").set_function(lambda g=g: g.refused)  # type: ignore[misc]
        closed.labels(g.name, "handshake_failed").set_function(
            lambda g=g: g.handshakes_failed)  # type: ignore[misc]


async def start(settings: GatewaySettings, *, reuse_port: bool = False,
                listeners: Listeners | None = None) -> tuple[web.AppRunner, list[int]]:
    """Start the Gateway in this event loop; returns the runner and the bound ports (worker,
    operator). Raises :class:`StartupError` (after releasing whatever it took) when it cannot.
    Every listener's connections pass through a :class:`ConnectionGuard` (header timeout,
    connection cap)."""
    worker_tls, operator_tls = tls_contexts(settings)
    if listeners is None:
        listeners = bind(settings, reuse_port=reuse_port)
    app = create_app(settings)
    app[LISTENER_PORTS] = listeners.by_port()
    runner = web.AppRunner(app, access_log=None, handle_signals=False,
                           keepalive_timeout=settings.keepalive_timeout_seconds,
                           shutdown_timeout=settings.shutdown_timeout_seconds)
    names = ["worker", "operator"] + (["health"] if listeners.health is not None else [])
    guards = [ConnectionGuard(name, header_timeout=settings.header_timeout_seconds,
                              max_connections=settings.max_connections_per_listener) for name in names]
    app[GUARDS] = guards
    _guard_metrics(app, guards)
    try:
        await runner.setup()
        sites: list[tuple[socket.socket, ssl.SSLContext | None]] = [
            (listeners.worker, worker_tls), (listeners.operator, operator_tls)]
        if listeners.health is not None:
            sites.append((listeners.health, None))  # plain HTTP: /healthz and /readyz only
        for (sock, context), guard in zip(sites, guards, strict=True):
            await GuardedSockSite(runner, sock, ssl_context=context, guard=guard, backlog=1024).start()
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
    worker_port, operator_port = ports
    log.info("gateway listening", extra={"host": settings.host, "worker_port": worker_port, "operator_port": operator_port,
                                         "health_port": settings.health_port})
    await stop.wait()
    started = time.monotonic()
    log.info("gateway stopping: no new connections, waiting long-polls answered, in-flight requests finishing",
             extra={"shutdown_timeout_seconds": settings.shutdown_timeout_seconds})
    await runner.cleanup()
    log.info("stopped", extra={"seconds": round(time.monotonic() - started, 3)})


def _run(settings: GatewaySettings, reuse_port: bool) -> int:
    """One serving process: its exit code (1 when it could not start, after one line on stderr).

    Tracing (``OTEL_*``, :mod:`leasehold.protocol.tracing`) is set up here, in each serving
    process (its exporter's thread would not survive a fork), and flushed on the way out."""
    tracing.configure("leasehold-gateway")
    try:
        asyncio.run(_serve_forever(settings, reuse_port))
    except StartupError as exc:
        print(f"leasehold: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_STARTUP
    finally:
        tracing.reset()
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
        asyncio.run(check_databases(settings))
    except StartupError as exc:
        print(f"leasehold: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_STARTUP
    return Supervisor(settings).run()


#: A child that exits with :data:`EXIT_STARTUP` this soon after it started could not start:
#: restarting it would fail the same way, so the supervisor stops.
STARTUP_SECONDS = 30.0
#: More restarts than this within :data:`RESTART_WINDOW_SECONDS`: give up (exit 1).
MAX_RESTARTS = 5
RESTART_WINDOW_SECONDS = 60.0


class Supervisor:
    """``--processes N``: N serving processes (SO_REUSEPORT), each restarted when it dies.

    A child that exits while the Gateway is not stopping (killed, crashed) is logged and
    replaced; one that could not start, or more than :data:`MAX_RESTARTS` restarts within
    :data:`RESTART_WINDOW_SECONDS`, stops them all and the supervisor exits 1. SIGTERM/SIGINT is
    passed to every child; the supervisor waits for them, logs ``stopped`` and exits 0 when all
    stopped cleanly, else 1.
    """

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.ctx = multiprocessing.get_context("spawn")
        self.children: list[Any] = []
        self.started: list[float] = []
        self.restarts: list[float] = []
        self.stopping = False

    def _spawn(self, slot: int) -> Any:
        child = self.ctx.Process(target=_child, args=(self.settings.model_dump_json(),), name=f"gateway-{slot}")
        child.start()
        return child

    def _signal(self, signum: int, _frame: Any) -> None:
        self.stopping = True
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        for child in self.children:
            if child.pid is not None and child.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signum)

    def _give_up(self, message: str, **fields: Any) -> int:
        log.error(message, extra=fields)
        print(f"leasehold: error: {message}", file=sys.stderr, flush=True)
        self.stopping = True
        self._forward(signal.SIGTERM)
        for child in self.children:
            child.join(self.settings.shutdown_timeout_seconds + 5)
            if child.exitcode is None:
                child.kill()
                child.join()
        return EXIT_STARTUP

    def run(self) -> int:
        # The children keep their counters in files here, so that /metrics sums them all.
        metrics_dir = tempfile.mkdtemp(prefix="leasehold-metrics-")
        os.environ[MULTIPROCESS_ENV] = metrics_dir
        try:
            return self._run()
        finally:
            os.environ.pop(MULTIPROCESS_ENV, None)
            shutil.rmtree(metrics_dir, ignore_errors=True)

    def _run(self) -> int:
        signal.signal(signal.SIGTERM, self._signal)
        signal.signal(signal.SIGINT, self._signal)
        for slot in range(self.settings.processes):
            self.children.append(self._spawn(slot))
            self.started.append(time.monotonic())
        log.info("gateway supervisor started", extra={"children": [c.pid for c in self.children]})
        while True:
            running = [c.sentinel for c in self.children if c.exitcode is None]
            if not running:
                break
            multiprocessing.connection.wait(running, timeout=1.0)
            if self.stopping:
                continue
            for slot, child in enumerate(self.children):
                if child.exitcode is None:
                    continue
                now = time.monotonic()
                how = f"signal {-child.exitcode}" if child.exitcode < 0 else f"exit code {child.exitcode}"
                if child.exitcode == EXIT_STARTUP and now - self.started[slot] < STARTUP_SECONDS:
                    return self._give_up(f"gateway process {child.pid} could not start ({how}); stopping all",
                                         pid=child.pid, exitcode=child.exitcode)
                self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW_SECONDS] + [now]
                if len(self.restarts) > MAX_RESTARTS:
                    return self._give_up(f"gateway processes died {len(self.restarts)} times within "
                                         f"{RESTART_WINDOW_SECONDS:.0f} s (last: pid {child.pid}, {how}); "
                                         "stopping all", pid=child.pid, exitcode=child.exitcode)
                replacement = self._spawn(slot)
                log.warning("gateway process died; restarted", extra={
                    "dead_pid": child.pid, "how": how, "new_pid": replacement.pid, "slot": slot})
                self.children[slot] = replacement
                self.started[slot] = now
                if self.stopping:  # SIGTERM arrived while it was being spawned: it was not told
                    self._forward(signal.SIGTERM)
        codes = [c.exitcode for c in self.children]
        log.info("stopped", extra={"exit_codes": codes})
        return 0 if all(code == 0 for code in codes) else 1
