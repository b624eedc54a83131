"""Real TLS: the worker API refuses anyone without a certificate from our CA."""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path

import aiohttp
import pytest

from gateway.pki import client_ssl_context, init_pki, issue_worker_certificate
from support.gateway import RunningGateway


async def _get(ctx: ssl.SSLContext, url: str) -> int:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, \
            s.post(url + "/v1/tasks/acquire", json={}) as r:
        return r.status


async def test_no_client_certificate_fails(gateway: RunningGateway) -> None:
    ctx = ssl.create_default_context(cafile=str(gateway.pki.ca_cert))
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        await _get(ctx, gateway.worker_url)


async def test_certificate_from_another_ca_fails(gateway: RunningGateway, tmp_path: Path) -> None:
    other = init_pki(tmp_path / "other")
    cert = issue_worker_certificate(other.directory, "intruder")
    ctx = client_ssl_context(gateway.pki.ca_cert, cert.cert_path, cert.key_path)
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        await _get(ctx, gateway.worker_url)


async def test_expired_certificate_fails(gateway: RunningGateway) -> None:
    now = dt.datetime.now(dt.UTC)
    cert = issue_worker_certificate(gateway.pki.directory, "expired-one", not_before=now - dt.timedelta(days=10),
                                    not_after=now - dt.timedelta(days=1))
    await gateway.registry.register_worker(name="expired-one", fingerprint=cert.fingerprint,
                                           task_types=("probe",))
    ctx = client_ssl_context(gateway.pki.ca_cert, cert.cert_path, cert.key_path)
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        await _get(ctx, gateway.worker_url)


async def test_valid_certificate_of_an_unregistered_worker_is_403(gateway: RunningGateway) -> None:
    worker = await gateway.worker(register=False)
    reply = await worker.acquire()
    assert reply.status == 403 and reply.headers["Content-Type"].startswith("application/problem+json")


async def test_operator_port_needs_no_client_certificate_but_a_key(gateway: RunningGateway) -> None:
    reply = await gateway.operator("GET", "/healthz")
    assert reply.status == 200
    reply = await gateway.operator("POST", "/v1/tasks/acquire", {}, key="wrong")
    assert reply.status == 403  # worker routes need a client certificate, whatever the key
