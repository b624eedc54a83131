"""The webhook signature, checked by the guide's own verification snippet: a genuine delivery
passes; a replay (its timestamp outside the tolerance), a changed body, id or timestamp, or
another subscription's secret fail."""

from __future__ import annotations

import time

import pytest

from leasehold.gateway.background.webhooks import sign
from leasehold.gateway.commands.webhooks import new_secret
from support.webhook_receiver import documented_verify

verify = documented_verify()


def headers(secret: str, delivery_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {"webhook-id": delivery_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(secret, delivery_id, timestamp, body)}


def test_a_genuine_delivery_verifies_and_every_forgery_or_replay_fails() -> None:
    secret, body, now = new_secret(), b'{"type":"task.failed"}', int(time.time())
    genuine = headers(secret, "msg-1", now, body)
    verify(secret, genuine, body)
    assert genuine["webhook-signature"].startswith("v1,")
    forgeries = [
        (secret, genuine, b'{"type":"scan.finished"}'),  # another body
        (secret, {**genuine, "webhook-id": "msg-2"}, body),  # another id
        (secret, {**genuine, "webhook-timestamp": str(now + 1)}, body),  # another timestamp
        (new_secret(), genuine, body),  # another subscription's secret
    ]
    for key, sent, received in forgeries:
        with pytest.raises(ValueError, match="signature"):
            verify(key, sent, received)
    with pytest.raises(ValueError, match="replay"):  # captured and sent again ten minutes later
        verify(secret, genuine, body, now=now + 600)


def test_the_signature_is_standard_webhooks_v1() -> None:
    """The scheme's published example (standard-webhooks, the reference libraries' tests)."""
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    assert sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == (
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
