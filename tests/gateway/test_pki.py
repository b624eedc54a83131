"""The Gateway's PKI and its mTLS contexts, proven against real TLS servers on 127.0.0.1.

No PostgreSQL needed. Each handshake test runs an asyncio server that upgrades the accepted
connection with ``server_ssl_context`` and reports, per connection, either the client
certificate's fingerprint or the exact TLS error the server raised — so a refusal is shown to
come from the server, for the expected reason.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import ssl
import stat
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID

from leasehold.cli import pki as pki_cli
from leasehold.cli.dev_ca import (
    IssuedCertificate,
    PkiExistsError,
    init_pki,
    issue_self_signed,
    issue_worker_certificate,
)
from leasehold.gateway.tls import (
    PkiError,
    PkiPaths,
    fingerprint_of_der,
    fingerprint_of_pem,
    load_pki,
    peer_fingerprint,
    server_ssl_context,
)
from leasehold.worker.client import client_ssl_context

# OpenSSL X509_V_ERR_* codes, stable across OpenSSL versions (the messages are not).
X509_V_ERR_CERT_NOT_YET_VALID = 9
X509_V_ERR_CERT_HAS_EXPIRED = 10
X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT = 18
X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY = 20
X509_V_ERR_INVALID_PURPOSE = 26

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PkiPaths:
    """One CA + server certificate for the whole module."""
    return init_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> PkiPaths:
    """A second, unrelated CA."""
    return init_pki(tmp_path_factory.mktemp("other-pki"))


@pytest.fixture(scope="module")
def worker_cert(pki: PkiPaths) -> IssuedCertificate:
    """A valid worker certificate from the module's CA."""
    return issue_worker_certificate(pki.directory, "worker-1")


def worker_context(pki: PkiPaths, issued: IssuedCertificate) -> ssl.SSLContext:
    """A worker's client context presenting ``issued``."""
    return client_ssl_context(pki.ca_cert, issued.cert_path, issued.key_path)


@dataclass
class Outcome:
    """What the server saw on one connection."""

    fingerprint: str | None = None
    error: BaseException | None = None


@contextlib.asynccontextmanager
async def mtls_server(ctx: ssl.SSLContext) -> AsyncIterator[tuple[int, asyncio.Queue[Outcome]]]:
    """An asyncio TLS server on 127.0.0.1 that reports each connection's outcome."""
    outcomes: asyncio.Queue[Outcome] = asyncio.Queue()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await writer.start_tls(ctx)
        except (ssl.SSLError, OSError) as exc:
            outcomes.put_nowait(Outcome(error=exc))
            writer.close()
            return
        fingerprint = peer_fingerprint(writer.get_extra_info("ssl_object"))
        outcomes.put_nowait(Outcome(fingerprint=fingerprint))
        writer.write(f"{fingerprint}\n".encode())
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, outcomes
    finally:
        server.close()
        await server.wait_closed()


async def client_exchange(port: int, ctx: ssl.SSLContext, server_hostname: str = "localhost") -> bytes:
    """Connect, complete the handshake and read the server's line ("" when refused)."""
    async with asyncio.timeout(TIMEOUT):
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname=server_hostname
            )
        except (ssl.SSLError, OSError):
            return b""
        try:
            return await reader.readline()
        except (ssl.SSLError, OSError):
            return b""
        finally:
            writer.close()


async def handshake(pki: PkiPaths, client_ctx: ssl.SSLContext) -> tuple[bytes, Outcome]:
    """One connection to a fresh Gateway-like server; return (client's line, server's outcome)."""
    async with mtls_server(server_ssl_context(pki)) as (port, outcomes):
        line = await client_exchange(port, client_ctx)
        async with asyncio.timeout(TIMEOUT):
            outcome = await outcomes.get()
    return line, outcome


def assert_verify_failure(outcome: Outcome, code: int) -> None:
    """The server refused the client certificate with OpenSSL verify error ``code``."""
    assert outcome.fingerprint is None
    assert isinstance(outcome.error, ssl.SSLCertVerificationError), outcome.error
    assert outcome.error.verify_code == code, outcome.error.verify_message


# --------------------------------------------------------------------------------------------
# Handshakes
# --------------------------------------------------------------------------------------------


async def test_worker_certificate_handshake_gives_server_its_fingerprint(
    pki: PkiPaths, worker_cert: IssuedCertificate
) -> None:
    line, outcome = await handshake(pki, worker_context(pki, worker_cert))

    assert outcome.error is None
    assert outcome.fingerprint == worker_cert.fingerprint
    assert outcome.fingerprint == fingerprint_of_pem(worker_cert.cert_path.read_bytes())
    assert line.decode().strip() == worker_cert.fingerprint


async def test_handshake_without_client_certificate_fails(pki: PkiPaths) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(pki.ca_cert))  # trusts the server, presents nothing

    line, outcome = await handshake(pki, ctx)

    assert line == b""
    assert outcome.fingerprint is None
    assert isinstance(outcome.error, ssl.SSLError)
    assert outcome.error.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE"


async def test_certificate_from_another_ca_fails(pki: PkiPaths, other_pki: PkiPaths) -> None:
    foreign = issue_worker_certificate(other_pki.directory, "intruder")
    ctx = client_ssl_context(pki.ca_cert, foreign.cert_path, foreign.key_path)

    line, outcome = await handshake(pki, ctx)

    assert line == b""
    assert_verify_failure(outcome, X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY)


async def test_expired_certificate_fails(pki: PkiPaths) -> None:
    now = dt.datetime.now(dt.UTC)
    expired = issue_worker_certificate(
        pki.directory, "expired", not_before=now - dt.timedelta(days=30), not_after=now - dt.timedelta(days=1)
    )

    line, outcome = await handshake(pki, worker_context(pki, expired))

    assert line == b""
    assert_verify_failure(outcome, X509_V_ERR_CERT_HAS_EXPIRED)


async def test_not_yet_valid_certificate_fails(pki: PkiPaths) -> None:
    future = issue_worker_certificate(
        pki.directory, "future", not_before=dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    )

    line, outcome = await handshake(pki, worker_context(pki, future))

    assert line == b""
    assert_verify_failure(outcome, X509_V_ERR_CERT_NOT_YET_VALID)


async def test_self_signed_certificate_fails(pki: PkiPaths, tmp_path: Path) -> None:
    forged = issue_self_signed(tmp_path, "worker-1")  # same name as a real worker, no CA behind it
    ctx = client_ssl_context(pki.ca_cert, forged.cert_path, forged.key_path)

    line, outcome = await handshake(pki, ctx)

    assert line == b""
    assert_verify_failure(outcome, X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT)


@pytest.mark.parametrize(
    ("name", "eku_client", "key_usage_ok"),
    [("server-eku", False, True), ("bad-key-usage", True, False)],
)
async def test_certificate_unfit_for_client_auth_fails(
    pki: PkiPaths, name: str, eku_client: bool, key_usage_ok: bool
) -> None:
    unfit = issue_worker_certificate(pki.directory, name, eku_client=eku_client, key_usage_ok=key_usage_ok)

    line, outcome = await handshake(pki, worker_context(pki, unfit))

    assert line == b""
    assert_verify_failure(outcome, X509_V_ERR_INVALID_PURPOSE)


@pytest.mark.skipif(not ssl.HAS_TLSv1_1, reason="this OpenSSL cannot speak TLS 1.1 at all")
async def test_tls_1_1_client_is_refused(pki: PkiPaths, worker_cert: IssuedCertificate) -> None:
    ctx = worker_context(pki, worker_cert)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # let the client really offer TLS 1.1

    line, outcome = await handshake(pki, ctx)

    assert line == b""
    assert outcome.fingerprint is None
    assert isinstance(outcome.error, ssl.SSLError)
    # The server received a TLS 1.1 ClientHello and refused the version.
    assert outcome.error.reason == "UNSUPPORTED_PROTOCOL"


async def test_tls_1_2_client_is_accepted(pki: PkiPaths, worker_cert: IssuedCertificate) -> None:
    ctx = worker_context(pki, worker_cert)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2

    line, outcome = await handshake(pki, ctx)

    assert outcome.fingerprint == worker_cert.fingerprint
    assert line.decode().strip() == worker_cert.fingerprint


async def test_worker_refuses_a_server_from_another_ca(
    pki: PkiPaths, other_pki: PkiPaths, worker_cert: IssuedCertificate
) -> None:
    rogue_server = server_ssl_context(other_pki)
    async with mtls_server(rogue_server) as (port, outcomes):
        with pytest.raises(ssl.SSLCertVerificationError):
            async with asyncio.timeout(TIMEOUT):
                await asyncio.open_connection(
                    "127.0.0.1", port, ssl=worker_context(pki, worker_cert), server_hostname="localhost"
                )
        async with asyncio.timeout(TIMEOUT):
            outcome = await outcomes.get()
    assert outcome.fingerprint is None


async def test_worker_checks_the_server_name(pki: PkiPaths, worker_cert: IssuedCertificate) -> None:
    async with mtls_server(server_ssl_context(pki)) as (port, _outcomes):
        with pytest.raises(ssl.SSLCertVerificationError):
            async with asyncio.timeout(TIMEOUT):
                await asyncio.open_connection(
                    "127.0.0.1", port, ssl=worker_context(pki, worker_cert), server_hostname="gateway.invalid"
                )


async def test_aiohttp_gateway_sees_worker_fingerprint(pki: PkiPaths, worker_cert: IssuedCertificate) -> None:
    async def whoami(request: web.Request) -> web.Response:
        assert request.transport is not None
        return web.json_response(
            {"fingerprint": peer_fingerprint(request.transport.get_extra_info("ssl_object"))}
        )

    app = web.Application()
    app.router.add_get("/whoami", whoami)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl_context(pki))
        await site.start()
        port = runner.addresses[0][1]
        url = f"https://127.0.0.1:{port}/whoami"  # the IP SAN is checked too
        timeout = aiohttp.ClientTimeout(total=TIMEOUT)

        connector = aiohttp.TCPConnector(ssl=worker_context(pki, worker_cert))
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            async with session.get(url) as response:
                assert response.status == 200
                assert await response.json() == {"fingerprint": worker_cert.fingerprint}

        anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        anonymous.load_verify_locations(cafile=str(pki.ca_cert))
        connector = aiohttp.TCPConnector(ssl=anonymous)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            with pytest.raises(aiohttp.ClientError):
                async with session.get(url) as response:
                    await response.read()
    finally:
        await runner.cleanup()


# --------------------------------------------------------------------------------------------
# Files, certificates and contexts
# --------------------------------------------------------------------------------------------


def test_init_pki_writes_ca_and_server_certificate(tmp_path: Path) -> None:
    paths = init_pki(tmp_path / "pki", server_names=["localhost", "127.0.0.1", "gw.example.test"])

    for key in (paths.ca_key, paths.server_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(paths.server_cert.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "gw.example.test"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert load_pki(paths.directory) == paths


def test_init_pki_refuses_to_overwrite_a_ca_unless_forced(tmp_path: Path) -> None:
    paths = init_pki(tmp_path)
    original = paths.ca_cert.read_bytes(), paths.ca_key.read_bytes()

    with pytest.raises(PkiExistsError):
        init_pki(tmp_path)
    assert (paths.ca_cert.read_bytes(), paths.ca_key.read_bytes()) == original

    assert init_pki(tmp_path, exist_ok=True) == paths
    assert paths.ca_cert.read_bytes() == original[0]

    init_pki(tmp_path, force=True)
    assert paths.ca_cert.read_bytes() != original[0]
    assert paths.ca_key.read_bytes() != original[1]


def test_issue_worker_certificate(pki: PkiPaths) -> None:
    issued = issue_worker_certificate(pki.directory, "scanner-7", days=10)

    assert issued.cert_path == pki.workers_dir / "scanner-7.pem"
    assert issued.key_path == pki.workers_dir / "scanner-7-key.pem"
    assert stat.S_IMODE(issued.key_path.stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(issued.cert_path.read_bytes())
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert 9 <= (cert.not_valid_after_utc - dt.datetime.now(dt.UTC)).days <= 10
    assert issued.fingerprint == fingerprint_of_der(cert.public_bytes(Encoding.DER))
    assert len(issued.fingerprint) == 64 and issued.fingerprint == issued.fingerprint.lower()

    with pytest.raises(PkiExistsError):
        issue_worker_certificate(pki.directory, "scanner-7")
    again = issue_worker_certificate(pki.directory, "scanner-7", force=True)
    assert again.fingerprint != issued.fingerprint


@pytest.mark.parametrize("name", ["", "../escape", "a/b", "-dash", "x-key", "a" * 65, "sp ace"])
def test_worker_names_are_checked(pki: PkiPaths, name: str) -> None:
    with pytest.raises(PkiError):
        issue_worker_certificate(pki.directory, name)


def test_contexts_trust_only_the_pki(pki: PkiPaths, worker_cert: IssuedCertificate) -> None:
    server = server_ssl_context(pki.directory)
    assert server.minimum_version == ssl.TLSVersion.TLSv1_2
    assert server.verify_mode == ssl.CERT_REQUIRED
    assert server.cert_store_stats()["x509_ca"] == 1  # our CA, not the system store

    client = worker_context(pki, worker_cert)
    assert client.minimum_version == ssl.TLSVersion.TLSv1_2
    assert client.verify_mode == ssl.CERT_REQUIRED
    assert client.check_hostname is True
    assert client.cert_store_stats()["x509_ca"] == 1


def test_cli_init_and_issue_worker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "pki"
    assert (
        pki_cli.main(["init", str(directory), "--server-name", "gw.local", "--server-name", "10.1.2.3"]) == 0
    )
    server = x509.load_pem_x509_certificate((directory / "server.pem").read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["gw.local"]
    capsys.readouterr()

    assert pki_cli.main(["issue-worker", str(directory), "w1", "--days", "30"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    cert_path = directory / "workers" / "w1.pem"
    assert out[-1] == fingerprint_of_pem(cert_path.read_bytes())
    assert any(str(cert_path) in line for line in out)
    assert any(str(directory / "workers" / "w1-key.pem") in line for line in out)

    assert pki_cli.main(["init", str(directory)]) == 1
    assert "already exists" in capsys.readouterr().err


def test_cli_registers_under_a_parent_parser(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="leasehold")
    pki_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pki", "init", str(tmp_path)])
    assert args.func(args) == 0
    assert (tmp_path / "ca.pem").is_file()
