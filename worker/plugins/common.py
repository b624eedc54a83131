"""The scanner plugin protocol, shared by every plugin in :mod:`worker.plugins`.

A plugin is run as ``python -m leasehold.worker.plugins.<name>``. It reads ONE JSON document on stdin::

    {"scope": {"targets": ["example.com", "10.0.0.5", "https://example.com:8443/", "10.0.1.0/28"],
               "ports": [22, 80, 443],
               "assets": [{"kind": "service", "value": "10.0.0.5:443/tcp", ...}, ...]},
     "parameters": {...}}

and writes JSON-lines records on stdout, one per line, flushed as they are found::

    {"type": "asset", "kind": "service", "value": "10.0.0.5:443/tcp", "attributes": {...}}
    {"type": "threat", "external_id": "tls-self-signed", "title": "...", "severity": "medium",
     "asset": {"kind": "service", "value": "10.0.0.5:443/tcp"}, "details": {...}}
    {"type": "exposure", "asset": {...}, "change": "opened", "details": {...}}
    {"type": "raw", ...}

Diagnostics go to stderr. Exit status: 0 on success (finding nothing is a success),
:data:`EXIT_BAD_INPUT` when the input document is unusable, :data:`EXIT_FAILURE` otherwise.

**Scope.** A plugin only ever contacts what the scope's ``targets`` name: their hosts (every
address of a CIDR target) and — when ``scope.ports`` is not empty — only those ports, plus the
explicit port of a ``host:port`` or URL target. ``assets`` from earlier plugins say *what* to
look at but never widen the scope: an asset outside it is skipped. :meth:`Scope.allows` is the
one check every plugin makes before it opens a connection (redirects included).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Literal, TextIO
from urllib.parse import urlsplit

import orjson

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILURE",
    "EXIT_OK",
    "Emitter",
    "PluginInput",
    "PluginInputError",
    "Scope",
    "Service",
    "Target",
    "asset_record",
    "asset_ref",
    "exposure_record",
    "format_host_port",
    "is_ip",
    "log",
    "param_float",
    "param_int",
    "parse_input",
    "parse_ports",
    "parse_service",
    "parse_target",
    "raw_record",
    "read_input",
    "run_plugin",
    "service_value",
    "threat_record",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2

MAX_INPUT_BYTES = 64 * 1024 * 1024
# A network target expands to its hosts; refuse anything bigger than a /16-ish sweep.
MAX_NETWORK_HOSTS = 65536

Severity = Literal["info", "low", "medium", "high", "critical"]
TargetKind = Literal["host", "ip", "url", "network"]

_plugin_name = "plugin"


class PluginInputError(ValueError):
    """The input document is not a valid plugin request."""


# --------------------------------------------------------------------------------------------
# Diagnostics
# --------------------------------------------------------------------------------------------


def log(message: str, **fields: object) -> None:
    """Write one diagnostic line to stderr (never stdout, which carries the records)."""
    extra = " ".join(f"{key}={value!r}" for key, value in fields.items())
    stamp = time.strftime("%H:%M:%S")
    line = f"{stamp} {_plugin_name}: {message}" + (f" {extra}" if extra else "")
    print(line, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Targets, services, scope
# --------------------------------------------------------------------------------------------


def is_ip(host: str) -> bool:
    """Tell whether ``host`` is an IPv4 or IPv6 literal (brackets allowed)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _normalise_host(host: str) -> str:
    host = host.strip().strip("[]")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.rstrip(".").lower()


def format_host_port(host: str, port: int) -> str:
    """Return ``host:port``, bracketing IPv6 literals (``[::1]:443``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def service_value(host: str, port: int, protocol: str = "tcp") -> str:
    """Return the value of a service asset: ``host:port/tcp``."""
    return f"{format_host_port(host, port)}/{protocol}"


@dataclass(frozen=True, slots=True)
class Target:
    """One parsed scope target."""

    raw: str
    kind: TargetKind
    host: str
    """Normalised host name (lowercase) or IP literal; for a network, its address."""
    port: int | None = None
    """The explicit port of ``host:port`` or of a URL (the scheme's default for a URL)."""
    scheme: str | None = None
    url: str | None = None
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None

    def hosts(self, limit: int = MAX_NETWORK_HOSTS) -> list[str]:
        """The hosts this target stands for: one, or every address of a network."""
        if self.network is None:
            return [self.host]
        if self.network.num_addresses > limit:
            raise PluginInputError(f"network target {self.raw!r} has more than {limit} addresses")
        if self.network.num_addresses <= 2:
            return [str(a) for a in self.network]
        return [str(a) for a in self.network.hosts()]


_DEFAULT_PORTS = {"http": 80, "https": 443}


def parse_target(raw: str) -> Target:
    """Parse a target: a host name, an IP, ``host:port``, a URL or a CIDR network."""
    text = raw.strip()
    if not text:
        raise PluginInputError("empty target")
    if "://" in text:
        parts = urlsplit(text)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise PluginInputError(f"unsupported URL scheme in target {raw!r}")
        if not parts.hostname:
            raise PluginInputError(f"no host in URL target {raw!r}")
        try:
            url_port = parts.port or _DEFAULT_PORTS[scheme]
        except ValueError as exc:
            raise PluginInputError(f"bad port in URL target {raw!r}") from exc
        return Target(
            raw=raw, kind="url", host=_normalise_host(parts.hostname), port=url_port, scheme=scheme, url=text
        )
    if "/" in text:
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError as exc:
            raise PluginInputError(f"bad network target {raw!r}") from exc
        return Target(raw=raw, kind="network", host=str(network.network_address), network=network)
    if is_ip(text):
        return Target(raw=raw, kind="ip", host=_normalise_host(text))
    host, port = _split_host_port(text, raw)
    if is_ip(host):
        return Target(raw=raw, kind="ip", host=_normalise_host(host), port=port)
    _check_hostname(host, raw)
    return Target(raw=raw, kind="host", host=_normalise_host(host), port=port)


def _split_host_port(text: str, raw: str) -> tuple[str, int | None]:
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise PluginInputError(f"bad target {raw!r}")
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise PluginInputError(f"bad target {raw!r}")
        return host, _port(rest[1:], raw)
    if text.count(":") == 1:
        host, _, port_text = text.partition(":")
        return host, _port(port_text, raw)
    return text, None


def _port(text: str, raw: str) -> int:
    try:
        port = int(text)
    except ValueError as exc:
        raise PluginInputError(f"bad port in {raw!r}") from exc
    if not 0 < port < 65536:
        raise PluginInputError(f"port out of range in {raw!r}")
    return port


def _check_hostname(host: str, raw: str) -> None:
    name = host.rstrip(".")
    if not name or len(name) > 253:
        raise PluginInputError(f"bad host name in target {raw!r}")
    for label in name.split("."):
        if not label or len(label) > 63 or label.startswith("-") or label.endswith("-"):
            raise PluginInputError(f"bad host name in target {raw!r}")
        if not all(c.isalnum() or c in "-_" for c in label):
            raise PluginInputError(f"bad host name in target {raw!r}")


@dataclass(frozen=True, slots=True)
class Service:
    """A ``host:port/protocol`` service, typically from a service asset."""

    host: str
    port: int
    protocol: str = "tcp"

    @property
    def value(self) -> str:
        """The service asset value, ``host:port/tcp``."""
        return service_value(self.host, self.port, self.protocol)


def parse_service(value: str) -> Service:
    """Parse a service asset value ``host:port/tcp`` (``/tcp`` optional, IPv6 in brackets)."""
    text = value.strip()
    protocol = "tcp"
    head, sep, tail = text.rpartition("/")
    if sep and tail.isalpha():
        text, protocol = head, tail.lower()
    host, port = _split_host_port(text, value)
    if port is None or not host:
        raise PluginInputError(f"bad service value {value!r}")
    return Service(host=_normalise_host(host), port=port, protocol=protocol)


def parse_ports(value: object, *, what: str = "ports") -> list[int]:
    """Parse a port list: integers and ``"a-b"`` ranges; returns sorted unique ports."""
    if value is None:
        return []
    if isinstance(value, (int, str)):
        value = [value]
    if not isinstance(value, list):
        raise PluginInputError(f"{what} must be a list")
    ports: set[int] = set()
    for item in value:
        if isinstance(item, bool):
            raise PluginInputError(f"bad port {item!r} in {what}")
        if isinstance(item, int):
            low = high = item
        elif isinstance(item, str):
            first, sep, last = item.strip().partition("-")
            try:
                low = int(first)
                high = int(last) if sep else low
            except ValueError as exc:
                raise PluginInputError(f"bad port {item!r} in {what}") from exc
        else:
            raise PluginInputError(f"bad port {item!r} in {what}")
        if not (0 < low <= high < 65536):
            raise PluginInputError(f"port {item!r} out of range in {what}")
        ports.update(range(low, high + 1))
    return sorted(ports)


@dataclass(slots=True)
class Scope:
    """What a plugin may touch: targets, ports and previously found assets."""

    targets: list[Target]
    ports: list[int]
    assets: list[dict[str, Any]]
    _hosts: set[str] = field(default_factory=set, repr=False)
    _networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = field(default_factory=list, repr=False)
    _host_ports: set[tuple[str, int]] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        for target in self.targets:
            if target.network is not None:
                self._networks.append(target.network)
            else:
                self._hosts.add(target.host)
            if target.port is not None:
                self._host_ports.add((target.host, target.port))
        # Assets are deliberately not added: they come from earlier runs and must not be able
        # to widen what this run may touch.

    def allows_host(self, host: str) -> bool:
        """Tell whether ``host`` (name or IP) is named by the scope."""
        normal = _normalise_host(host)
        if normal in self._hosts:
            return True
        if self._networks and is_ip(normal):
            address = ipaddress.ip_address(normal)
            return any(address in network for network in self._networks)
        return False

    def allows(self, host: str, port: int) -> bool:
        """Tell whether the plugin may connect to ``host:port``.

        The host must be named by a target; when ``scope.ports`` is not empty the port must be
        one of them, or the explicit port of a target on that host.
        """
        if not self.allows_host(host):
            return False
        if not self.ports:
            return True
        return port in self.ports or (_normalise_host(host), port) in self._host_ports

    def services(self) -> list[Service]:
        """Services from the ``service`` assets, in scope, without duplicates."""
        found: dict[str, Service] = {}
        for item in self.assets:
            if item.get("kind") != "service" or not isinstance(item.get("value"), str):
                continue
            try:
                service = parse_service(item["value"])
            except PluginInputError as exc:
                log("skipping bad service asset", error=str(exc))
                continue
            if service.protocol == "tcp" and self.allows(service.host, service.port):
                found.setdefault(service.value, service)
        return list(found.values())

    def hosts(self) -> list[str]:
        """Every host of every target (networks expanded), in order, without duplicates."""
        seen: dict[str, None] = {}
        for target in self.targets:
            for host in target.hosts():
                seen.setdefault(host, None)
        return list(seen)


@dataclass(slots=True)
class PluginInput:
    """The parsed stdin document."""

    scope: Scope
    parameters: dict[str, Any]


def parse_input(document: bytes | str) -> PluginInput:
    """Parse and validate the plugin's input document."""
    try:
        data = orjson.loads(document)
    except orjson.JSONDecodeError as exc:
        raise PluginInputError(f"input is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise PluginInputError("input must be a JSON object")
    scope = data.get("scope")
    if not isinstance(scope, dict):
        raise PluginInputError("input.scope must be an object")
    parameters = data.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise PluginInputError("input.parameters must be an object")
    raw_targets = scope.get("targets") or []
    if not isinstance(raw_targets, list) or not all(isinstance(t, str) for t in raw_targets):
        raise PluginInputError("scope.targets must be a list of strings")
    assets = scope.get("assets") or []
    if not isinstance(assets, list) or not all(isinstance(a, dict) for a in assets):
        raise PluginInputError("scope.assets must be a list of objects")
    targets = [parse_target(t) for t in raw_targets]
    for target in targets:
        target.hosts()  # refuse oversized networks up front
    return PluginInput(
        scope=Scope(
            targets=targets, ports=parse_ports(scope.get("ports"), what="scope.ports"), assets=assets
        ),
        parameters=parameters,
    )


def read_input(stream: BinaryIO | None = None) -> PluginInput:
    """Read the one JSON document from stdin (or ``stream``) and parse it."""
    source = stream if stream is not None else sys.stdin.buffer
    document = source.read(MAX_INPUT_BYTES + 1)
    if len(document) > MAX_INPUT_BYTES:
        raise PluginInputError("input document too large")
    return parse_input(document)


def param_int(
    parameters: Mapping[str, Any], name: str, default: int, *, minimum: int = 1, maximum: int | None = None
) -> int:
    """Read an integer parameter, checking its range."""
    value = parameters.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PluginInputError(f"parameter {name} must be an integer")
    if value < minimum or (maximum is not None and value > maximum):
        raise PluginInputError(f"parameter {name} out of range")
    return value


def param_float(
    parameters: Mapping[str, Any],
    name: str,
    default: float,
    *,
    minimum: float = 0.001,
    maximum: float = 3600.0,
) -> float:
    """Read a number parameter (seconds, say), checking its range."""
    value = parameters.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PluginInputError(f"parameter {name} must be a number")
    if not minimum <= value <= maximum:
        raise PluginInputError(f"parameter {name} out of range")
    return float(value)


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


def asset_ref(kind: str, value: str) -> dict[str, str]:
    """The short ``{"kind", "value"}`` reference used by threats and exposures."""
    return {"kind": kind, "value": value}


def asset_record(kind: str, value: str, attributes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Build an ``asset`` record."""
    return {"type": "asset", "kind": kind, "value": value, "attributes": dict(attributes or {})}


def threat_record(
    *,
    title: str,
    severity: Severity,
    asset: Mapping[str, str],
    external_id: str = "",
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build a ``threat`` record."""
    return {
        "type": "threat",
        "external_id": external_id,
        "title": title,
        "severity": severity,
        "asset": dict(asset),
        "details": dict(details or {}),
    }


def exposure_record(
    asset: Mapping[str, str], change: Literal["opened", "closed"], details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Build an ``exposure`` record."""
    return {"type": "exposure", "asset": dict(asset), "change": change, "details": dict(details or {})}


def raw_record(**data: Any) -> dict[str, Any]:
    """Build a ``raw`` record for extra data (errors, measurements…)."""
    return {"type": "raw", **data}


class Emitter:
    """Writes records to stdout as JSON lines, one per line, flushed at once."""

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout.buffer
        self.count = 0

    def emit(self, record: Mapping[str, Any]) -> None:
        """Write one record."""
        self._stream.write(orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS) + b"\n")
        self._stream.flush()
        self.count += 1

    def emit_all(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Write several records."""
        for record in records:
            self.emit(record)


# --------------------------------------------------------------------------------------------
# Running a plugin
# --------------------------------------------------------------------------------------------


def run_plugin(
    name: str,
    body: Callable[[PluginInput, Emitter], Coroutine[Any, Any, None]],
    *,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Read the input, run ``body`` on an event loop, and return the process exit code.

    Plugins end their ``__main__`` block with ``sys.exit(run_plugin("name", scan))``.
    """
    global _plugin_name
    _plugin_name = name
    with contextlib.redirect_stderr(stderr) if stderr is not None else contextlib.nullcontext():
        try:
            request = read_input(stdin)
        except PluginInputError as exc:
            log("invalid input", error=str(exc))
            return EXIT_BAD_INPUT
        emitter = Emitter(stdout)
        started = time.monotonic()
        try:
            asyncio.run(body(request, emitter))
        except PluginInputError as exc:
            log("invalid parameters", error=str(exc))
            return EXIT_BAD_INPUT
        except BrokenPipeError:
            log("stdout closed by the reader")
            # Point stdout at /dev/null so the interpreter's final flush does not fail again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_FAILURE
        except KeyboardInterrupt:
            log("interrupted")
            return EXIT_FAILURE
        except Exception as exc:  # the last line of defence: say what failed, exit non-zero
            log("failed", error=f"{type(exc).__name__}: {exc}")
            return EXIT_FAILURE
        log("done", records=emitter.count, seconds=round(time.monotonic() - started, 3))
        return EXIT_OK
