"""A Gateway SIGKILLed while its webhook deliveries are in flight loses none: another Gateway
sends them once their claims' lease has passed, and the receiver, deduplicating by id, processes
every notification exactly once (those in flight at the kill arrive twice)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from leasehold.gateway.tls import PkiPaths
from support.gateway import GatewayProcess
from support.services import wall_clock_services
from support.waits import wait_until
from support.webhook_receiver import Receiver

pytestmark = pytest.mark.slow

SCANS = 30  # more than a batch (20): some wait unsent at the kill
OPTIONS = {"webhook_interval_seconds": 0.05, "webhook_timeout_seconds": 0.5, "webhook_backoff_base_seconds": 0.1,
           "webhook_backoff_cap_seconds": 0.5}


async def test_deliveries_in_flight_when_the_gateway_is_killed_are_sent_again_by_the_next(
        database_url: str, pki: PkiPaths, tmp_path: Path) -> None:
    receiver = Receiver(hold=asyncio.Event())  # requests wait: the kill lands mid-delivery
    await receiver.up()
    first = GatewayProcess(database_url, pki, tmp_path / "gateway-1.log", dict(OPTIONS))
    second = GatewayProcess(database_url, pki, tmp_path / "gateway-2.log", dict(OPTIONS))
    try:
        async with wall_clock_services(database_url) as services:
            org = await services.registry.create_organization("webhook-restart")
            subscription, secret = await services.webhooks.create(
                org, receiver.url(), event_types=["scan.finished"], description=None, actor="test")
            receiver.secrets["hook"] = secret
            scans = [await services.scans.create_scan(org, {"targets": ["192.0.2.10"]}) for _ in range(SCANS)]
            for scan in scans:
                await services.scans.cancel_scan(scan)  # ends at once: one notification each

            await first.start()
            await wait_until(receiver.arrived.is_set, 30, what="a delivery in flight")
            assert await first.kill() != 0
            receiver.hold.set()  # type: ignore[union-attr]  # the held requests end: the sender is gone
            assert len(receiver.processed) < SCANS  # a batch was in flight, the rest not even sent

            await second.start()
            await receiver.wait_for(SCANS, 60)

            async def all_recorded() -> bool:
                async with services.db.pool.connection() as conn:
                    cur = await conn.execute("SELECT count(*) FROM webhook_deliveries WHERE subscription_id = %s "
                                             "AND delivered_at IS NOT NULL", (subscription,))
                    row = await cur.fetchone()
                return row is not None and row[0] == SCANS

            await wait_until(all_recorded, 30, what="every delivery recorded as delivered")
    finally:
        await first.kill()
        await second.kill()
        await receiver.down()
    assert sorted(b["data"]["scan_id"] for b in receiver.processed.values()) == sorted(str(s) for s in scans)
    assert max(receiver.received.values()) == 2  # those in flight at the kill, sent again: deduplicated
    assert receiver.refused == []

