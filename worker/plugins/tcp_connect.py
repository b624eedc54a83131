"""TCP connect scan: which of the scope's ports are open on the scope's hosts.

Parameters (all optional):

``ports``        ports to try (integers or ``"a-b"`` ranges). When ``scope.ports`` is set, only
                 ports that are also in it are tried; without it, ``scope.ports`` is used, and
                 without either, :data:`DEFAULT_PORTS`.
``timeout``      seconds per connection attempt (default 2).
``concurrency``  connection attempts in flight at once (default 100).
``max_probes``   refuse a scan of more host × port pairs than this (default 100 000).

Targets written ``host:port`` or as URLs are also probed on that port. For every open port it
emits a ``service`` asset (value ``host:port/tcp``) and an ``exposure`` record with change
``opened``. Closed and filtered ports produce nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import sys
import time
from collections.abc import Iterator

from leasehold.worker.plugins.common import (
    Emitter,
    PluginInput,
    PluginInputError,
    Scope,
    asset_record,
    asset_ref,
    exposure_record,
    log,
    param_float,
    param_int,
    parse_ports,
    run_plugin,
    service_value,
)

__all__ = ["DEFAULT_PORTS", "probe", "scan", "select_ports"]

PLUGIN = "tcp_connect"
DEFAULT_PORTS: tuple[int, ...] = (
    21, 22, 23, 25, 53, 80, 110, 143, 443, 445, 465, 587, 993, 995,
    1433, 3306, 3389, 5432, 5900, 6379, 8000, 8080, 8443, 9200, 27017,
)  # fmt: skip


def select_ports(scope: Scope, parameters: dict[str, object]) -> list[int]:
    """The ports to try: the parameter's, limited to ``scope.ports`` when that is set."""
    wanted = parse_ports(parameters.get("ports"), what="parameters.ports")
    if scope.ports:
        if not wanted:
            return list(scope.ports)
        allowed = set(scope.ports)
        dropped = [p for p in wanted if p not in allowed]
        if dropped:
            log("ignoring ports outside the scope", ports=dropped[:20], count=len(dropped))
        return [p for p in wanted if p in allowed]
    return wanted or list(DEFAULT_PORTS)


async def probe(host: str, port: int, time_limit: float) -> tuple[bool, str | None, float]:
    """Try one TCP connection; return (open, peer address, seconds taken)."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(time_limit):
            _reader, writer = await asyncio.open_connection(host, port)
    except (TimeoutError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno not in (
            errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNRESET, None,
        ):  # fmt: skip
            log("connect error", host=host, port=port, error=str(exc))
        return False, None, time.monotonic() - started
    elapsed = time.monotonic() - started
    peer = writer.get_extra_info("peername")
    address = str(peer[0]) if isinstance(peer, tuple) and peer else None
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True, address, elapsed


async def scan(request: PluginInput, out: Emitter) -> None:
    """Connect to every in-scope host × port and report the open ones."""
    scope, parameters = request.scope, request.parameters
    ports = select_ports(scope, parameters)
    hosts = scope.hosts()
    timeout = param_float(parameters, "timeout", 2.0, maximum=120.0)
    concurrency = param_int(parameters, "concurrency", 100, maximum=4096)
    max_probes = param_int(parameters, "max_probes", 100_000)
    # Targets given as host:port or URL are also probed on their own port.
    extra = [(t.host, t.port) for t in scope.targets if t.port is not None and t.port not in ports]
    total = len(hosts) * len(ports) + len(extra)
    if total > max_probes:
        raise PluginInputError(f"{total} probes requested, more than max_probes={max_probes}")
    log("scanning", hosts=len(hosts), ports=len(ports), timeout=timeout, concurrency=concurrency)

    candidates = itertools.chain(itertools.product(hosts, ports), dict.fromkeys(extra))
    pairs: Iterator[tuple[str, int]] = ((h, p) for h, p in candidates if scope.allows(h, p))
    open_count = 0

    async def worker() -> None:
        nonlocal open_count
        for host, port in pairs:  # a shared iterator: each pair is taken by exactly one worker
            is_open, address, elapsed = await probe(host, port, timeout)
            if not is_open:
                continue
            open_count += 1
            value = service_value(host, port)
            attributes = {
                "host": host,
                "port": port,
                "protocol": "tcp",
                "state": "open",
                "address": address,
                "connect_ms": round(elapsed * 1000, 2),
            }
            out.emit(asset_record("service", value, attributes))
            out.emit(
                exposure_record(
                    asset_ref("service", value), "opened", {"host": host, "port": port, "protocol": "tcp"}
                )
            )

    workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, max(total, 1)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
    log("scan finished", probes=total, open=open_count)


if __name__ == "__main__":
    sys.exit(run_plugin(PLUGIN, scan))
