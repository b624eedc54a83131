"""DNS resolution: turn the scope's host names into addresses.

For each host-name target (plain, ``host:port`` or the host of a URL) it asks the system
resolver (``getaddrinfo``) and emits a ``dns_name`` asset with the addresses it found, and one
``ip`` asset per address. IP literals are passed through as an ``ip`` asset and a ``host``
asset. Network (CIDR) targets are left alone: reverse lookups are not done.

Parameters (all optional): ``timeout`` (seconds per name, default 5), ``concurrency``
(default 20), ``families`` (``["ipv4", "ipv6"]`` by default).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import sys
from typing import Any

from leasehold.worker.plugins.common import (
    Emitter,
    PluginInput,
    PluginInputError,
    asset_record,
    is_ip,
    log,
    param_float,
    param_int,
    raw_record,
    run_plugin,
)

__all__ = ["resolve", "scan"]

PLUGIN = "dns_resolve"
_FAMILIES = {"ipv4": socket.AF_INET, "ipv6": socket.AF_INET6}


async def resolve(name: str, time_limit: float, families: set[socket.AddressFamily]) -> list[str]:
    """Resolve ``name`` with the system resolver; return its unique addresses in answer order."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(time_limit):
        infos = await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    addresses: dict[str, None] = {}
    for family, _type, _proto, _canon, sockaddr in infos:
        if family in families:
            addresses.setdefault(str(ipaddress.ip_address(str(sockaddr[0]).split("%")[0])), None)
    return list(addresses)


def _version(address: str) -> int:
    return ipaddress.ip_address(address).version


async def scan(request: PluginInput, out: Emitter) -> None:
    """Resolve every host-name target; pass IP literals through."""
    parameters = request.parameters
    timeout = param_float(parameters, "timeout", 5.0, maximum=120.0)
    concurrency = param_int(parameters, "concurrency", 20, maximum=256)
    wanted = parameters.get("families", ["ipv4", "ipv6"])
    if not isinstance(wanted, list) or not wanted or not set(wanted) <= set(_FAMILIES):
        raise PluginInputError('parameter families must be a non-empty list of "ipv4"/"ipv6"')
    families = {_FAMILIES[f] for f in wanted}

    names: dict[str, list[str]] = {}  # host name -> the raw targets that name it
    literals: dict[str, list[str]] = {}
    for target in request.scope.targets:
        if target.kind == "network":
            log("network target not resolved", target=target.raw)
            continue
        bucket = literals if is_ip(target.host) else names
        bucket.setdefault(target.host, []).append(target.raw)

    for address, raws in literals.items():
        out.emit(
            asset_record("host", address, {"addresses": [address], "source": "literal", "targets": raws})
        )

    semaphore = asyncio.Semaphore(concurrency)
    ip_names: dict[str, list[str]] = {address: [] for address in literals}

    async def lookup(name: str, raws: list[str]) -> None:
        async with semaphore:
            try:
                addresses = await resolve(name, timeout, families)
            except (OSError, TimeoutError) as exc:  # socket.gaierror is an OSError
                log("resolution failed", name=name, error=str(exc) or type(exc).__name__)
                out.emit(
                    raw_record(
                        plugin=PLUGIN,
                        event="resolution_failed",
                        name=name,
                        error=f"{type(exc).__name__}: {exc}",
                    )
                )
                return
        out.emit(asset_record("dns_name", name, {
            "addresses": addresses,
            "ipv4": [a for a in addresses if _version(a) == 4],
            "ipv6": [a for a in addresses if _version(a) == 6],
            "targets": raws,
        }))  # fmt: skip
        for address in addresses:
            ip_names.setdefault(address, []).append(name)

    await asyncio.gather(*(lookup(n, r) for n, r in names.items()))
    # One ip asset per address, whether it was a literal target, an answer, or both.
    for address, hostnames in ip_names.items():
        attributes: dict[str, Any] = {
            "version": _version(address),
            "source": "literal" if address in literals else "dns",
            "hostnames": sorted(set(hostnames)),
        }
        if address in literals:
            attributes["targets"] = literals[address]
        out.emit(asset_record("ip", address, attributes))


if __name__ == "__main__":
    sys.exit(run_plugin(PLUGIN, scan))
