"""Scanner plugins, run as real subprocesses against real servers on the loopback interface.

Every plugin is started as ``python -m worker.plugins.<name>`` with a JSON scope on stdin; the
tests parse its JSON-lines output. Servers: a plain HTTP server (title, Server header,
redirects), an HTTPS server with a self-signed certificate, and bare TCP "tripwire" listeners
that record every connection, to prove that a plugin never touches what is out of scope.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from leasehold.cli.dev_ca import IssuedCertificate, init_pki, issue_self_signed
from leasehold.worker.plugins.common import PluginInputError, Scope, parse_ports, parse_service, parse_target

REPO_ROOT = Path(__file__).resolve().parents[2]
RECORD_TYPES = {"asset", "threat", "file", "exposure", "raw"}
TIMEOUT = 60.0
PAGE = (
    "<!doctype html><html><head><meta charset='utf-8'>"
    "<title>\n  Leasehold   Test &amp; Page </title></head><body>hello</body></html>"
)


# --------------------------------------------------------------------------------------------
# Running plugins
# --------------------------------------------------------------------------------------------


@dataclass
class PluginRun:
    """A finished plugin process."""

    returncode: int
    records: list[dict[str, Any]]
    stderr: str

    def of(self, type_: str, kind: str | None = None) -> list[dict[str, Any]]:
        """Records of one type (and asset kind)."""
        return [r for r in self.records if r["type"] == type_ and (kind is None or r.get("kind") == kind)]

    def asset(self, kind: str, value: str) -> dict[str, Any]:
        """The one asset record of that kind and value."""
        found = [r for r in self.of("asset", kind) if r["value"] == value]
        assert len(found) == 1, (kind, value, self.records, self.stderr)
        return found[0]


async def run_plugin(name: str, document: dict[str, Any] | bytes) -> PluginRun:
    """Run ``python -m worker.plugins.NAME`` with ``document`` on stdin."""
    data = document if isinstance(document, bytes) else json.dumps(document).encode()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        f"leasehold.worker.plugins.{name}",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    try:
        async with asyncio.timeout(TIMEOUT):
            stdout, stderr = await proc.communicate(data)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    records = []
    for line in stdout.decode().splitlines():
        record = json.loads(line)  # every stdout line is one JSON document
        assert isinstance(record, dict) and record.get("type") in RECORD_TYPES, line
        records.append(record)
    assert proc.returncode is not None
    return PluginRun(proc.returncode, records, stderr.decode())


def scope(
    targets: list[str],
    ports: list[int] | None = None,
    assets: list[dict[str, Any]] | None = None,
    parameters: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A plugin input document."""
    return {
        "scope": {"targets": targets, "ports": ports or [], "assets": assets or []},
        "parameters": parameters or {},
    }


def service(port: int, host: str = "127.0.0.1") -> dict[str, Any]:
    """A service asset as an earlier plugin would have reported it."""
    return {"kind": "service", "value": f"{host}:{port}/tcp", "attributes": {}}


# --------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------


@dataclass
class Tripwire:
    """A TCP listener that records the source port of every connection it accepts."""

    host: str
    port: int
    accepted: list[int] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def assert_untouched(self) -> None:
        """Prove no one but us connected: our own probe must be the first connection accepted.

        Connections are accepted in arrival order, so once our probe is accepted any earlier
        connection from a plugin would already be in ``accepted``.
        """
        reader, writer = await asyncio.open_connection(self.host, self.port)
        own_port = writer.get_extra_info("sockname")[1]
        try:
            async with asyncio.timeout(10):
                while own_port not in self.accepted:
                    self.arrived.clear()
                    await self.arrived.wait()
        finally:
            writer.close()
        assert self.accepted == [own_port], f"out-of-scope connections from ports {self.accepted[:-1]}"


@contextlib.asynccontextmanager
async def tripwire(host: str = "127.0.0.1") -> AsyncIterator[Tripwire]:
    """Listen on ``host`` (a free port) and record connections."""
    wire = Tripwire(host, 0)

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        wire.accepted.append(writer.get_extra_info("peername")[1])
        wire.arrived.set()
        writer.close()

    try:
        server = await asyncio.start_server(on_connect, host, 0)
    except OSError as exc:
        pytest.skip(f"cannot listen on {host}: {exc}")
    wire.port = server.sockets[0].getsockname()[1]
    try:
        yield wire
    finally:
        server.close()
        await server.wait_closed()


@dataclass
class HttpServer:
    """A running aiohttp test server."""

    port: int
    hits: dict[str, int]


@contextlib.asynccontextmanager
async def http_server(
    ssl_context: ssl.SSLContext | None = None,
    *,
    title_page: str = PAGE,
    redirects: dict[str, tuple[int, str]] | None = None,
) -> AsyncIterator[HttpServer]:
    """Serve ``/`` (an HTML page, ``Server: leasehold-test/1.0``) and the given redirects."""
    hits: dict[str, int] = {}
    routes = dict(redirects or {})

    async def handle(request: web.Request) -> web.StreamResponse:
        hits[request.path] = hits.get(request.path, 0) + 1
        if request.path in routes:
            status, location = routes[request.path]
            response = web.Response(status=status, headers={"Location": location})
        elif request.path == "/":
            response = web.Response(text=title_page, content_type="text/html")
        else:
            response = web.Response(status=404, text="not found")
        response.headers["Server"] = "leasehold-test/1.0"
        return response

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
        yield HttpServer(port=runner.addresses[0][1], hits=hits)
    finally:
        await runner.cleanup()


def tls_server_context(cert: IssuedCertificate) -> ssl.SSLContext:
    """A plain HTTPS server context for ``cert``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert.cert_path, cert.key_path)
    return ctx


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 with nothing listening (bound without listen, so it stays closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


# --------------------------------------------------------------------------------------------
# tcp_connect
# --------------------------------------------------------------------------------------------


async def test_tcp_connect_reports_open_port_and_not_closed_one(closed_port: int) -> None:
    async with http_server() as server:
        run = await run_plugin(
            "tcp_connect", scope(["127.0.0.1"], [server.port, closed_port], parameters={"timeout": 2})
        )

    assert run.returncode == 0, run.stderr
    value = f"127.0.0.1:{server.port}/tcp"
    found = run.asset("service", value)
    assert found["attributes"]["port"] == server.port
    assert found["attributes"]["state"] == "open"
    assert run.of("exposure") == [
        {
            "type": "exposure",
            "asset": {"kind": "service", "value": value},
            "change": "opened",
            "details": {"host": "127.0.0.1", "port": server.port, "protocol": "tcp"},
        }
    ]
    assert not [r for r in run.records if str(closed_port) in json.dumps(r)]


async def test_tcp_connect_probes_the_explicit_port_of_a_target(closed_port: int) -> None:
    async with http_server() as server:
        targets = [f"127.0.0.1:{server.port}", f"http://localhost:{server.port}/"]
        run = await run_plugin("tcp_connect", scope(targets, parameters={"ports": [closed_port]}))

    assert run.returncode == 0, run.stderr
    assert sorted(r["value"] for r in run.of("asset", "service")) == [
        f"127.0.0.1:{server.port}/tcp",
        f"localhost:{server.port}/tcp",
    ]


async def test_tcp_connect_never_touches_ports_outside_the_scope() -> None:
    async with tripwire() as allowed, tripwire() as forbidden:
        # The parameters ask for both ports; the scope grants only one.
        document = scope(["127.0.0.1"], [allowed.port], parameters={"ports": [allowed.port, forbidden.port]})
        run = await run_plugin("tcp_connect", document)
        await forbidden.assert_untouched()

    assert run.returncode == 0, run.stderr
    assert [r["value"] for r in run.of("asset", "service")] == [f"127.0.0.1:{allowed.port}/tcp"]
    assert len(allowed.accepted) == 1


async def test_tcp_connect_never_touches_hosts_outside_the_scope() -> None:
    async with tripwire("127.0.0.1") as inside, tripwire("127.0.0.2") as outside:
        run = await run_plugin("tcp_connect", scope(["127.0.0.1"], [inside.port, outside.port]))
        await outside.assert_untouched()

    assert run.returncode == 0, run.stderr
    assert [r["value"] for r in run.of("asset", "service")] == [f"127.0.0.1:{inside.port}/tcp"]


# --------------------------------------------------------------------------------------------
# http_probe
# --------------------------------------------------------------------------------------------


async def test_http_probe_records_status_title_and_server_of_a_service() -> None:
    async with http_server() as server:
        run = await run_plugin("http_probe", scope(["127.0.0.1"], assets=[service(server.port)]))

    assert run.returncode == 0, run.stderr
    url = f"http://127.0.0.1:{server.port}/"
    attributes = run.asset("url", url)["attributes"]
    assert attributes["status"] == 200
    assert attributes["title"] == "Leasehold Test & Page"
    assert attributes["server"] == "leasehold-test/1.0"
    assert attributes["redirects"] == []
    assert attributes["final_url"] == url
    assert not run.of("asset", "url")[1:]  # HTTPS was tried first and failed: no https:// asset


async def test_http_probe_follows_redirects() -> None:
    redirects = {"/start": (302, "/middle"), "/middle": (301, "/")}
    async with http_server(redirects=redirects) as server:
        start = f"http://127.0.0.1:{server.port}/start"
        run = await run_plugin("http_probe", scope([start]))

    assert run.returncode == 0, run.stderr
    base = f"http://127.0.0.1:{server.port}"
    attributes = run.asset("url", start)["attributes"]
    assert attributes["redirects"] == [
        {"url": f"{base}/start", "status": 302, "location": f"{base}/middle"},
        {"url": f"{base}/middle", "status": 301, "location": f"{base}/"},
    ]
    assert attributes["final_url"] == f"{base}/"
    assert attributes["status"] == 200
    assert attributes["title"] == "Leasehold Test & Page"
    assert server.hits == {"/start": 1, "/middle": 1, "/": 1}


async def test_http_probe_stops_after_five_redirects() -> None:
    async with http_server(redirects={"/loop": (302, "/loop")}) as server:
        start = f"http://127.0.0.1:{server.port}/loop"
        run = await run_plugin("http_probe", scope([start]))

    assert run.returncode == 0, run.stderr
    attributes = run.asset("url", start)["attributes"]
    assert server.hits == {"/loop": 6}  # the first request and five redirects, no more
    assert attributes["redirect_not_followed"]["reason"] == "too many redirects"
    assert attributes["status"] == 302


async def test_http_probe_does_not_follow_redirects_out_of_scope() -> None:
    async with tripwire("127.0.0.2") as other_host, tripwire("127.0.0.1") as other_port:
        redirects = {
            "/away": (302, f"http://127.0.0.2:{other_host.port}/"),
            "/sideways": (302, f"http://127.0.0.1:{other_port.port}/"),
        }
        async with http_server(redirects=redirects) as server:
            targets = [f"http://127.0.0.1:{server.port}/away", f"http://127.0.0.1:{server.port}/sideways"]
            run = await run_plugin("http_probe", scope(targets, [server.port]))
        await other_host.assert_untouched()
        await other_port.assert_untouched()

    assert run.returncode == 0, run.stderr
    for target in targets:
        attributes = run.asset("url", target)["attributes"]
        assert attributes["status"] == 302
        assert attributes["redirect_not_followed"]["reason"] == "redirect leaves the scope"


async def test_http_probe_https_service_with_self_signed_certificate(tmp_path: Path) -> None:
    cert = issue_self_signed(tmp_path, "https-server")
    page = "<html><head><title>Secure</title></head></html>"
    async with http_server(tls_server_context(cert), title_page=page) as server:
        run = await run_plugin("http_probe", scope(["127.0.0.1"], assets=[service(server.port)]))

    assert run.returncode == 0, run.stderr
    attributes = run.asset("url", f"https://127.0.0.1:{server.port}/")["attributes"]
    assert attributes["status"] == 200
    assert attributes["title"] == "Secure"
    assert attributes["scheme"] == "https"
    assert len(run.of("asset", "url")) == 1  # HTTPS answered, so plain HTTP was not tried


# --------------------------------------------------------------------------------------------
# tls_inspect
# --------------------------------------------------------------------------------------------


async def test_tls_inspect_reports_self_signed_certificate(tmp_path: Path) -> None:
    cert = issue_self_signed(tmp_path, "inspected", days=90)
    async with http_server(tls_server_context(cert)) as server:
        run = await run_plugin("tls_inspect", scope(["127.0.0.1"], assets=[service(server.port)]))

    assert run.returncode == 0, run.stderr
    attributes = run.asset("certificate", cert.fingerprint)["attributes"]
    assert attributes["self_signed"] is True
    assert attributes["expired"] is False
    assert attributes["days_to_expiry"] in (89, 90)
    assert attributes["subject"] == attributes["issuer"]
    assert "CN=inspected" in attributes["subject"]
    assert attributes["protocol"] in ("TLSv1.2", "TLSv1.3")
    assert attributes["cipher"]
    assert attributes["service"] == f"127.0.0.1:{server.port}/tcp"
    assert attributes["ip_addresses"] == ["127.0.0.1"]
    threats = run.of("threat")
    assert [t["external_id"] for t in threats] == ["tls-self-signed"]
    assert threats[0]["severity"] == "medium"
    assert threats[0]["asset"] == {"kind": "service", "value": f"127.0.0.1:{server.port}/tcp"}
    assert threats[0]["details"]["certificate_sha256"] == cert.fingerprint


async def test_tls_inspect_reports_expired_certificate(tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    cert = issue_self_signed(
        tmp_path, "stale", not_before=now - dt.timedelta(days=40), not_after=now - dt.timedelta(days=3)
    )
    async with http_server(tls_server_context(cert)) as server:
        run = await run_plugin("tls_inspect", scope([f"127.0.0.1:{server.port}"]))

    assert run.returncode == 0, run.stderr
    attributes = run.asset("certificate", cert.fingerprint)["attributes"]
    assert attributes["expired"] is True
    assert attributes["days_to_expiry"] in (-4, -3)
    by_id = {t["external_id"]: t for t in run.of("threat")}
    assert set(by_id) == {"tls-self-signed", "tls-expired"}
    assert by_id["tls-expired"]["severity"] == "high"


async def test_tls_inspect_ca_signed_certificate_is_not_self_signed(tmp_path: Path) -> None:
    paths = init_pki(tmp_path / "pki")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(paths.server_cert, paths.server_key)
    async with http_server(ctx) as server:
        run = await run_plugin("tls_inspect", scope([f"https://localhost:{server.port}/"]))

    assert run.returncode == 0, run.stderr
    [certificate] = run.of("asset", "certificate")
    assert certificate["attributes"]["self_signed"] is False
    assert certificate["attributes"]["dns_names"] == ["localhost"]
    assert certificate["attributes"]["service"] == f"localhost:{server.port}/tcp"
    assert run.of("threat") == []


async def test_tls_inspect_plain_service_is_a_raw_failure_not_an_error() -> None:
    async with http_server() as server:
        run = await run_plugin("tls_inspect", scope(["127.0.0.1"], assets=[service(server.port)]))

    assert run.returncode == 0, run.stderr
    assert run.of("asset") == []
    [raw] = run.of("raw")
    assert raw["event"] == "tls_handshake_failed"


@pytest.mark.parametrize("plugin", ["http_probe", "tls_inspect"])
async def test_service_assets_outside_the_scope_are_never_contacted(plugin: str) -> None:
    async with tripwire("127.0.0.2") as other_host, tripwire("127.0.0.1") as other_port:
        # Assets from earlier runs do not widen the scope: one names a host the targets do not,
        # the other a port that scope.ports does not grant.
        assets = [service(other_host.port, host="127.0.0.2"), service(other_port.port)]
        run = await run_plugin(plugin, scope(["127.0.0.1"], [443], assets=assets))
        await other_host.assert_untouched()
        await other_port.assert_untouched()

    assert run.returncode == 0, run.stderr
    assert run.records == []


# --------------------------------------------------------------------------------------------
# dns_resolve
# --------------------------------------------------------------------------------------------


async def test_dns_resolve_localhost_and_ip_literals() -> None:
    run = await run_plugin("dns_resolve", scope(["localhost", "127.0.0.1", "http://localhost:8080/"]))

    assert run.returncode == 0, run.stderr
    name = run.asset("dns_name", "localhost")
    addresses = name["attributes"]["addresses"]
    assert addresses and set(addresses) <= {"127.0.0.1", "::1"}
    assert name["attributes"]["targets"] == ["localhost", "http://localhost:8080/"]
    for address in addresses:
        assert "localhost" in run.asset("ip", address)["attributes"]["hostnames"]
    assert run.asset("host", "127.0.0.1")["attributes"]["source"] == "literal"
    assert run.asset("ip", "127.0.0.1")["attributes"]["version"] == 4
    assert len(run.of("asset", "ip")) == len({r["value"] for r in run.of("asset", "ip")})


# --------------------------------------------------------------------------------------------
# Protocol
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("plugin", ["tcp_connect", "http_probe", "tls_inspect", "dns_resolve"])
@pytest.mark.parametrize(
    "document",
    [b"not json", b"[]", b'{"scope": {"targets": "127.0.0.1"}}', b'{"scope": {"targets": ["a b c"]}}'],
)
async def test_bad_input_exits_2_with_a_diagnostic(plugin: str, document: bytes) -> None:
    run = await run_plugin(plugin, document)

    assert run.returncode == 2
    assert run.records == []
    assert "invalid input" in run.stderr


@pytest.mark.parametrize("plugin", ["tcp_connect", "http_probe", "tls_inspect", "dns_resolve"])
async def test_empty_scope_succeeds_with_no_records(plugin: str) -> None:
    run = await run_plugin(plugin, scope([]))

    assert run.returncode == 0, run.stderr
    assert run.records == []


def test_parse_target_kinds() -> None:
    assert parse_target("Example.COM").host == "example.com"
    assert parse_target("10.0.0.1").kind == "ip"
    ip_port = parse_target("10.0.0.1:8443")
    assert (ip_port.kind, ip_port.host, ip_port.port) == ("ip", "10.0.0.1", 8443)
    v6 = parse_target("[::1]:443")
    assert (v6.kind, v6.host, v6.port) == ("ip", "::1", 443)
    url = parse_target("https://Example.com/path")
    assert (url.kind, url.host, url.port, url.scheme) == ("url", "example.com", 443, "https")
    network = parse_target("192.0.2.0/30")
    assert network.kind == "network" and network.hosts() == ["192.0.2.1", "192.0.2.2"]
    for bad in ["", "ftp://x", "host:99999", "a b", "10.0.0.0/33"]:
        with pytest.raises(PluginInputError):
            parse_target(bad)


def test_scope_allows_only_named_hosts_and_ports() -> None:
    limited = Scope(targets=[parse_target("10.0.0.1"), parse_target("192.0.2.0/29")], ports=[443], assets=[])
    assert limited.allows("10.0.0.1", 443)
    assert limited.allows("192.0.2.5", 443)
    assert not limited.allows("10.0.0.1", 80)
    assert not limited.allows("10.0.0.2", 443)
    assert not limited.allows("192.0.2.8", 443)

    with_assets = Scope(
        targets=[parse_target("https://a.example:8443/")], ports=[443], assets=[service(22, "a.example")]
    )
    assert with_assets.allows("a.example", 8443)  # the URL's own port
    assert with_assets.allows("a.example", 443)
    assert not with_assets.allows("a.example", 22)  # an asset does not widen the scope
    assert with_assets.services() == []

    assert parse_ports([22, "80-82", 22]) == [22, 80, 81, 82]
    assert parse_service("[::1]:443/tcp").value == "[::1]:443/tcp"
