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

from gateway.app import create_app
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


async def start(settings: GatewaySettings, *, reuse_port: bool = False) -> tuple[web.AppRunner, list[int]]:
    """Start the Gateway in this event loop; returns the runner and the bound ports (worker, operator)."""
    paths = tls_paths(settings)
    runner = web.AppRunner(create_app(settings), access_log=None, handle_signals=False)
    await runner.setup()
    worker_site = web.TCPSite(runner, settings.host, settings.worker_port, ssl_context=server_ssl_context(paths),
                              reuse_port=reuse_port, backlog=1024)
    operator_site = web.TCPSite(runner, settings.host, settings.operator_port,
                                ssl_context=operator_ssl_context(paths), reuse_port=reuse_port)
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
