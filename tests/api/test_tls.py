"""Real TLS, past the handshake: a certificate from our CA is not yet a worker, and the operator
port takes no client certificate. The handshake refusals (no certificate, expired, not yet valid,
another CA, self-signed, unfit for client authentication, TLS below 1.2) are
``tests/security/test_certificates.py``, against this same running Gateway."""

from __future__ import annotations

from support.gateway import RunningGateway


async def test_valid_certificate_of_an_unregistered_worker_is_403(gateway: RunningGateway) -> None:
    worker = await gateway.worker(register=False)
    reply = await worker.acquire()
    assert reply.status == 403 and reply.headers["Content-Type"].startswith("application/problem+json")


async def test_operator_port_needs_no_client_certificate_but_a_key(gateway: RunningGateway) -> None:
    reply = await gateway.operator("GET", "/healthz")
    assert reply.status == 200
    reply = await gateway.operator("POST", "/v1/tasks/acquire", {}, key="wrong")
    assert reply.status == 404  # the worker API is not served on the operator port at all
