"""Webhooks end to end against a real local HTTP receiver: every notification reaches a receiver
that deduplicates by id exactly once, through a receiver that is down, slow and answers 500s;
signatures verify with the guide's own snippet; a delivery that never gets through is
dead-lettered and redelivered; the whole workflow through the typed client and through the
``leasehold webhooks`` command, with another organisation's ids answering 404 and a bad URL 422.
No raw HTTP to the Gateway here."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from test_finding_work_cli import leasehold

from leasehold.client import ApiError, OperatorClient
from leasehold.gateway.commands.lifecycle import TaskSpec
from leasehold.gateway.keys import METRICS
from leasehold.gateway.tls import PkiPaths
from support.bulk import failed_tasks
from support.gateway import ADMIN_KEY, RunningGateway, running_gateway
from support.slim import without_server_env
from support.waits import wait_until
from support.webhook_receiver import Receiver

#: Fast retries, so that faults cost fractions of a second.
FAST = {"webhook_interval_seconds": 0.05, "webhook_timeout_seconds": 0.4, "webhook_backoff_base_seconds": 0.05,
        "webhook_backoff_cap_seconds": 0.2}


@asynccontextmanager
async def hooked(database_url: str, pki: PkiPaths, **overrides: Any) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, pki, **{**FAST, **overrides}) as gateway:
        yield gateway


def client(gateway: RunningGateway, key: str = ADMIN_KEY) -> OperatorClient:
    return OperatorClient(gateway.operator_url, key, ca_file=str(gateway.pki.ca_cert))


async def stored(gateway: RunningGateway, subscription: object) -> dict[str, str]:
    """Each delivery of the subscription: its id and state, from the database."""
    async with gateway.services.db.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id::text, CASE WHEN delivered_at IS NOT NULL THEN 'delivered' WHEN dead_lettered_at IS NOT NULL "
            "THEN 'dead' ELSE 'pending' END FROM webhook_deliveries WHERE subscription_id = %s", (subscription,))
        return {r[0]: r[1] for r in await cur.fetchall()}


async def all_delivered(gateway: RunningGateway, subscription: object) -> dict[str, str] | None:
    """The subscription's deliveries once there are some and every one is delivered, else None."""
    states = await stored(gateway, subscription)
    return states if states and set(states.values()) == {"delivered"} else None


async def test_every_notification_is_processed_once_through_a_receiver_down_slow_and_failing(
        database_url: str, pki: PkiPaths) -> None:
    receiver = Receiver(fail=lambda n: n % 3 == 0, slow=lambda n: n % 4 == 0, slow_seconds=0.6)
    async with hooked(database_url, pki, webhook_max_attempts=100) as gateway, client(gateway) as admin:
        hook = await admin.create_webhook(receiver.url(), organization_id=gateway.org,
                                          event_types=["scan.finished", "task.failed"])
        receiver.secrets["hook"] = hook.secret
        services = gateway.services
        # Notifications while the receiver is down: 16 scans that end (cancelled before any task)…
        scans = [await services.scans.create_scan(gateway.org, {"targets": ["127.0.0.1"]}) for _ in range(16)]
        for scan in scans:
            await services.scans.cancel_scan(scan)
        # …and 3 tasks failed for good (their scan kept open by a task nobody runs).
        await services.lifecycle.create_task(gateway.scan, TaskSpec(task_type="hold"))
        failed = await failed_tasks(services, gateway.org, gateway.scan, 3)

        async def refused_sends() -> bool:
            async with services.db.pool.connection() as conn:
                cur = await conn.execute("SELECT count(*) FROM webhook_deliveries WHERE subscription_id = %s "
                                         "AND attempts >= 2 AND last_status IS NULL", (hook.id,))
                row = await cur.fetchone()
            return row is not None and row[0] > 0

        await wait_until(refused_sends, what="sends refused while the receiver is down")
        await receiver.up()
        try:
            await receiver.wait_for(19)
            states = await wait_until(lambda: all_delivered(gateway, hook.id), 30,
                                      what="every delivery recorded as delivered")
        finally:
            await receiver.down()
    assert len(states) == 19 and set(receiver.processed) == set(states)  # none lost, none made up
    assert receiver.refused == []  # every request carried a valid, fresh signature
    assert max(receiver.received.values()) >= 2  # late answers were sent again: the dedup by id was needed
    kinds = sorted(body["type"] for body in receiver.processed.values())
    assert kinds == ["scan.finished"] * 16 + ["task.failed"] * 3
    assert {b["data"]["scan_id"] for b in receiver.processed.values() if b["type"] == "scan.finished"} == {
        str(s) for s in scans}
    assert {b["data"]["task_id"] for b in receiver.processed.values() if b["type"] == "task.failed"} == {
        str(t) for t in failed}
    assert all(b["id"] == i and b["organization_id"] == str(gateway.org) for i, b in receiver.processed.items())


async def test_subscriptions_dead_letters_and_redelivery_through_the_typed_client(
        database_url: str, pki: PkiPaths) -> None:
    receiver = Receiver()  # not up yet: every send is refused
    async with hooked(database_url, pki, webhook_max_attempts=2) as gateway, client(gateway) as admin:
        key = (await admin.create_api_key(gateway.org, "hooks")).key
        other = await admin.create_organization(f"other-{uuid.uuid4().hex[:8]}")
        outsider = (await admin.create_api_key(other.id, "outsider")).key
        async with client(gateway, key) as api, client(gateway, outsider) as stranger:
            with pytest.raises(ApiError) as bad:
                await api.create_webhook("ftp://hooks.example.com/x")
            assert bad.value.status == 422 and "url" in orjson.dumps(bad.value.body).decode()
            with pytest.raises(ApiError) as foreign:
                await stranger.create_webhook(receiver.url(), organization_id=gateway.org)
            assert foreign.value.status == 404

            hook = await api.create_webhook(receiver.url(), description="on-call")
            receiver.secrets["hook"] = hook.secret
            assert hook.organization_id == gateway.org and hook.secret.startswith("whsec_")
            assert sorted(hook.event_types) == sorted(
                ["scan.finished", "scan.failed", "task.failed", "task.cancellation_stuck", "worker.gone"])
            shown = await api.get_webhook(hook.id)
            assert shown.id == hook.id and "secret" not in shown.model_dump()
            assert [h.id for h in (await api.list_webhooks()).items] == [hook.id]
            assert (await stranger.list_webhooks()).items == []

            ping = await api.test_webhook(hook.id)
            assert ping.event_type == "webhook.test" and ping.state == "pending"

            async def dead() -> list[Any]:
                return (await api.webhook_deliveries(hook.id, state="dead")).items

            (letter,) = await wait_until(dead, what="the ping dead-lettered after two refused sends")
            assert letter.id == ping.id and letter.attempts == 2 and letter.last_status is None
            assert letter.last_error and "Connect" in letter.last_error
            for call in (lambda: stranger.get_webhook(hook.id), lambda: stranger.webhook_deliveries(hook.id),
                         lambda: stranger.redeliver_webhook(hook.id, ping.id), lambda: stranger.test_webhook(hook.id),
                         lambda: stranger.delete_webhook(hook.id), lambda: api.redeliver_webhook(hook.id, uuid.uuid4())):
                with pytest.raises(ApiError) as hidden:
                    await call()
                assert hidden.value.status == 404

            await receiver.up()
            try:
                again = await api.redeliver_webhook(hook.id, ping.id)
                assert again.state == "pending" and again.attempts == 0
                await receiver.wait_for(1)

                async def delivered() -> list[Any]:
                    return (await api.webhook_deliveries(hook.id, state="delivered")).items

                (done,) = await wait_until(delivered, what="the redelivered ping recorded as delivered")
            finally:
                await receiver.down()
            assert done.id == ping.id and done.last_status == 204 and done.delivered_at is not None
            body = receiver.processed[str(ping.id)]
            assert body["type"] == "webhook.test" and body["data"] == {"requested_by": body["data"]["requested_by"]}
            assert receiver.refused == []

            sends = gateway.app[METRICS].registry
            assert sends.get_sample_value("leasehold_webhook_sends_total", {"outcome": "retry"}) == 1
            assert sends.get_sample_value("leasehold_webhook_sends_total", {"outcome": "dead"}) == 1
            assert sends.get_sample_value("leasehold_webhook_sends_total", {"outcome": "delivered"}) == 1

            gone = await api.delete_webhook(hook.id)
            assert not gone.enabled and not (await api.get_webhook(hook.id)).enabled
            with pytest.raises(ApiError) as disabled:
                await api.test_webhook(hook.id)
            assert disabled.value.status == 409


@pytest.fixture(scope="module")
def base_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return without_server_env(tmp_path_factory.mktemp("client-only"))


async def cli(gateway: RunningGateway, env: dict[str, str], *args: str) -> Any:
    code, out, err = await leasehold(gateway, env, "webhooks", *args, "--json")
    assert code == 0, (args, err)
    items = [orjson.loads(line) for line in out.splitlines()]
    return items[0] if len(items) == 1 else items


async def test_the_webhook_workflow_from_the_command_line(database_url: str, pki: PkiPaths,
                                                          base_env: dict[str, str]) -> None:
    receiver = Receiver()
    await receiver.up()
    try:
        async with hooked(database_url, pki) as gateway:
            code, out, err = await leasehold(gateway, base_env, "webhooks", "create", receiver.url(),
                                             "--organization", str(gateway.org), "--event", "scan.failed")
            assert code == 0 and "secret: whsec_" in out and "never shown again" in err, (out, err)
            hook_id = out.split()[0]
            receiver.secrets["hook"] = out.split("secret: ")[1].strip()
            shown = await cli(gateway, base_env, "show", hook_id)
            assert shown["event_types"] == ["scan.failed"] and shown["url"] == receiver.url() and "secret" not in shown
            assert hook_id in [h["id"] for h in [await cli(gateway, base_env, "list")]]
            ping = await cli(gateway, base_env, "test", hook_id)
            await receiver.wait_for(1)
            await wait_until(lambda: all_delivered(gateway, hook_id), what="the ping recorded as delivered")
            (done,) = [await cli(gateway, base_env, "deliveries", hook_id, "--state", "delivered")]
            assert done["id"] == ping["id"] and done["last_status"] == 204
            again = await cli(gateway, base_env, "redeliver", hook_id, ping["id"])
            assert again["state"] == "pending"
            await wait_until(lambda: receiver.received[ping["id"]] == 2, what="the redelivery received")
            assert len(receiver.processed) == 1  # the same id: processed once
            assert (await cli(gateway, base_env, "delete", hook_id))["enabled"] is False
    finally:
        await receiver.down()
    assert receiver.refused == []
