"""The worker port of a running Gateway refuses every certificate it must, at the TLS handshake.

Each case connects to the real Gateway's worker port (``gateway.serve.start``: the same
``server_ssl_context`` as production) and asks for ``/healthz``. It passes only when

* the Gateway's own TLS layer refused the handshake for exactly the expected reason (OpenSSL's
  verify code, or the handshake error), read from the Gateway's side of the connection: the
  event loop that serves it runs in debug mode during the attempt and logs each failed
  handshake with its exception;
* no HTTP request reached the application (its request counter is unchanged) and nothing was
  recorded (the event count is unchanged);
* the same connection made with a valid worker certificate gets its ``200`` (the control).

A worker revoked while its keep-alive connection is open is refused on its next request (403):
``tests/api/test_revocation.py::test_worker_is_refused_on_its_next_request_over_an_open_keep_alive_connection``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import ssl
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from leasehold.cli.dev_ca import IssuedCertificate, init_pki, issue_self_signed, issue_worker_certificate
from leasehold.worker.client import client_ssl_context
from support.gateway import RunningGateway
from support.waits import wait_until

# OpenSSL X509_V_ERR_* codes, stable across OpenSSL versions (the messages are not).
CERT_NOT_YET_VALID, CERT_HAS_EXPIRED, SELF_SIGNED, UNKNOWN_ISSUER, INVALID_PURPOSE = 9, 10, 18, 20, 26


async def handshake_refusal(gateway: RunningGateway, ctx: ssl.SSLContext,
                            expected: Callable[[BaseException], bool],
                            caplog: pytest.LogCaptureFixture) -> list[BaseException]:
    """Connect to the worker port with ``ctx`` and ask for /healthz; asserts that no HTTP answer
    came back, waits (with a deadline) for the Gateway's side to log the ``expected`` TLS error,
    and returns every TLS error logged meanwhile."""
    port = int(gateway.worker_url.rsplit(":", 1)[1])
    loop = asyncio.get_running_loop()
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        loop.set_debug(True)
        try:
            answer = b""
            try:
                async with asyncio.timeout(10):
                    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                                                   server_hostname="localhost")
                    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    await writer.drain()
                    answer = await reader.read()
                    writer.close()
            except (ssl.SSLError, OSError):
                pass
            assert answer == b"", answer[:200]
            # The server side may log just after the client gave up: its log is the signal. Not
            # seen in time, the caller's assertion shows what was logged instead.
            with contextlib.suppress(AssertionError):
                await wait_until(lambda: any(expected(e) for e in logged_errors(caplog)), 5,
                                 what="the Gateway to log the TLS error", interval=0.01)
        finally:
            loop.set_debug(False)
    return logged_errors(caplog)


def logged_errors(caplog: pytest.LogCaptureFixture) -> list[BaseException]:
    return [r.exc_info[1] for r in caplog.records if r.exc_info and r.exc_info[1] is not None]


def verify_failure(code: int) -> Callable[[BaseException], bool]:
    return lambda e: isinstance(e, ssl.SSLCertVerificationError) and e.verify_code == code


def handshake_error(reason: str) -> Callable[[BaseException], bool]:
    return lambda e: isinstance(e, ssl.SSLError) and e.reason == reason


async def served(gateway: RunningGateway) -> str:
    ctx = ssl.create_default_context(cafile=str(gateway.pki.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, \
            s.get(gateway.operator_url + "/metrics") as r:
        text = await r.text()
    return "\n".join(line for line in text.splitlines()
                     if line.startswith("leasehold_http_requests_total") and "/metrics" not in line)


def presenting(gateway: RunningGateway, issued: IssuedCertificate) -> ssl.SSLContext:
    return client_ssl_context(gateway.pki.ca_cert, issued.cert_path, issued.key_path)


async def assert_refused(gateway: RunningGateway, ctx: ssl.SSLContext, expected: Callable[[BaseException], bool],
                         caplog: pytest.LogCaptureFixture) -> None:
    requests, events = await served(gateway), await gateway.count("SELECT count(*) FROM events")
    errors = await handshake_refusal(gateway, ctx, expected, caplog)
    assert any(expected(e) for e in errors), errors
    assert await served(gateway) == requests  # no request reached the application
    assert await gateway.count("SELECT count(*) FROM events") == events


async def worker_certificate(gateway: RunningGateway, name: str, **options: object) -> IssuedCertificate:
    """A certificate from the Gateway's CA, registered and assigned like any worker's."""
    name = f"{name}-{uuid.uuid4().hex[:8]}"  # one PKI for the whole session
    issued = issue_worker_certificate(gateway.pki.directory, name, **options)  # type: ignore[arg-type]
    worker_id = await gateway.registry.register_worker(name=name, fingerprint=issued.fingerprint,
                                                       task_types=("probe",))
    await gateway.registry.assign_worker(worker_id, gateway.org)
    return issued


NOW = dt.datetime.now(dt.UTC)


@pytest.fixture
async def control(gateway: RunningGateway) -> None:
    """A valid worker certificate gets its answer over the very same kind of connection."""
    ctx = presenting(gateway, await worker_certificate(gateway, "valid-control"))
    port = int(gateway.worker_url.rsplit(":", 1)[1])
    async with asyncio.timeout(10):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        await writer.drain()
        assert (await reader.read()).startswith(b"HTTP/1.1 200 OK")
        writer.close()


async def test_no_client_certificate(gateway: RunningGateway, control: None,
                                     caplog: pytest.LogCaptureFixture) -> None:
    ctx = ssl.create_default_context(cafile=str(gateway.pki.ca_cert))  # trusts the Gateway, presents nothing
    await assert_refused(gateway, ctx, handshake_error("PEER_DID_NOT_RETURN_A_CERTIFICATE"), caplog)


async def test_expired_certificate(gateway: RunningGateway, control: None, caplog: pytest.LogCaptureFixture) -> None:
    issued = await worker_certificate(gateway, "expired", not_before=NOW - dt.timedelta(days=30),
                                      not_after=NOW - dt.timedelta(days=1))
    await assert_refused(gateway, presenting(gateway, issued), verify_failure(CERT_HAS_EXPIRED), caplog)


async def test_not_yet_valid_certificate(gateway: RunningGateway, control: None,
                                         caplog: pytest.LogCaptureFixture) -> None:
    issued = await worker_certificate(gateway, "future", not_before=NOW + dt.timedelta(days=1))
    await assert_refused(gateway, presenting(gateway, issued), verify_failure(CERT_NOT_YET_VALID), caplog)


async def test_certificate_of_another_ca(gateway: RunningGateway, control: None, tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    other = init_pki(tmp_path / "other-ca")
    foreign = issue_worker_certificate(other.directory, "intruder")
    # Even registered by its fingerprint, a certificate the Gateway's CA did not sign gets nowhere.
    await gateway.registry.register_worker(name="intruder", fingerprint=foreign.fingerprint, task_types=("probe",))
    await assert_refused(gateway, presenting(gateway, foreign), verify_failure(UNKNOWN_ISSUER), caplog)


async def test_self_signed_certificate(gateway: RunningGateway, control: None, tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    forged = issue_self_signed(tmp_path, "valid-control")  # a real worker's name, no CA behind it
    await gateway.registry.register_worker(name="forged", fingerprint=forged.fingerprint, task_types=("probe",))
    await assert_refused(gateway, presenting(gateway, forged), verify_failure(SELF_SIGNED), caplog)


@pytest.mark.parametrize(("name", "options"), [
    ("server-eku", {"eku_client": False}),  # extended key usage serverAuth, not clientAuth
    ("bad-key-usage", {"key_usage_ok": False}),  # key usage without digitalSignature
])
async def test_certificate_unfit_for_client_authentication(gateway: RunningGateway, control: None, name: str,
                                                           options: dict[str, bool],
                                                           caplog: pytest.LogCaptureFixture) -> None:
    issued = await worker_certificate(gateway, name, **options)
    await assert_refused(gateway, presenting(gateway, issued), verify_failure(INVALID_PURPOSE), caplog)


@pytest.mark.parametrize("version", ["TLSv1", "TLSv1_1"])
async def test_tls_below_1_2(gateway: RunningGateway, control: None, version: str,
                             caplog: pytest.LogCaptureFixture) -> None:
    if not getattr(ssl, f"HAS_{version}", False):
        pytest.skip(f"this OpenSSL cannot speak {version} at all")
    ctx = presenting(gateway, await worker_certificate(gateway, f"old-{version.lower().replace('_', '-')}"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ctx.maximum_version = getattr(ssl.TLSVersion, version)
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # let the client really offer it
    await assert_refused(gateway, ctx, handshake_error("UNSUPPORTED_PROTOCOL"), caplog)


@pytest.mark.parametrize(("name", "options", "reason"), [
    # Both pass OpenSSL's purpose check (it refuses an extendedKeyUsage without clientAuth, not a
    # missing one, and never looks at a leaf's basicConstraints): the Gateway refuses them itself.
    ("no-eku", {"eku_absent": True}, "no extendedKeyUsage extension"),
    ("ca-leaf", {"ca": True}, "is a CA certificate"),
])
async def test_a_certificate_without_client_auth_or_saying_ca_true_is_refused_before_any_work(
        gateway: RunningGateway, control: None, name: str, options: dict[str, bool], reason: str,
        caplog: pytest.LogCaptureFixture) -> None:
    issued = await worker_certificate(gateway, name, **options)
    events = await gateway.count("SELECT count(*) FROM events")
    ctx = presenting(gateway, issued)
    with caplog.at_level(logging.WARNING, logger="leasehold.gateway"):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            for _ in range(2):  # refused every time, not only on the first sight of the certificate
                async with s.post(gateway.worker_url + "/v1/tasks/acquire", json={"wait_seconds": 0}) as r:
                    assert r.status == 403, await r.text()
                    assert r.content_type == "application/problem+json"
                    problem = await r.json()
                    assert reason in problem["detail"] and problem["fingerprint"] == issued.fingerprint
    assert await gateway.count("SELECT count(*) FROM events") == events
    assert any("unfit for client authentication" in rec.getMessage() for rec in caplog.records)
