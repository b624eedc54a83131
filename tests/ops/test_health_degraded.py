"""Health that says degraded: ``/readyz`` names the slow or down dependencies (still 200), ``GET
/v1/health`` gives each check's detail, and ``leasehold_health_degraded{check}`` exports them."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from leasehold.gateway import health
from leasehold.gateway.keys import HINTS, METRICS
from leasehold.gateway.tls import PkiPaths
from leasehold.persistence.seals import generate_keypair
from support.gateway import RunningGateway, running_gateway, service_get
from support.waits import wait_until


async def degraded_series(gw: RunningGateway) -> dict[str, float]:
    ctx = ssl.create_default_context(cafile=str(gw.pki.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session, \
            session.get(gw.operator_url + "/metrics") as r:
        text = await r.text()
    return {s.labels["check"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "leasehold_health_degraded"}


async def sampled(gw: RunningGateway) -> None:
    await wait_until(lambda: gw.app[METRICS].sampled_at is not None, 10, what="the database gauges to be sampled")


async def test_a_healthy_gateway_is_ready_and_says_what_it_checked(database_url: str, pki: PkiPaths,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "SLOW_DATABASE_SECONDS", 5.0)  # a loaded test machine is not a slow database
    async with running_gateway(database_url, pki, metrics_sample_seconds=0.1) as gw:
        await sampled(gw)
        ready = await gw.operator("GET", "/readyz")
        detail = await gw.operator("GET", "/v1/health")
        series = await degraded_series(gw)
        public = await service_get(gw.pki, gw.operator_url + "/v1/health")  # no key, like /metrics
    assert ready.status == 200 and ready.body["status"] == "ready" and ready.body["degraded"] == []
    assert detail.status == 200 and detail.body["status"] == "ready", detail.body
    checks = detail.body["checks"]
    assert {name: c["state"] for name, c in checks.items()} == {
        "database": "ok", "listen": "ok", "redis": "off", "digest_sink": "off", "partitions": "ok"}
    assert 0 < checks["database"]["seconds"] < 5.0
    assert checks["partitions"]["seconds"] > health.PARTITIONS_AHEAD_SECONDS  # two months by default
    assert series == dict.fromkeys(health.CHECKS, 0.0)
    assert public.status == 200 and public.body["checks"]["database"]["state"] == "ok"


async def test_redis_down_is_degraded_not_unready(database_url: str, pki: PkiPaths, redis_server: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "SLOW_DATABASE_SECONDS", 5.0)  # a loaded test machine is not a slow database
    async with running_gateway(database_url, pki, redis_url=redis_server.url) as gw:
        hints = gw.app[HINTS]
        await wait_until(lambda: hints.connected, 10, what="Redis to be connected")
        assert (await gw.operator("GET", "/readyz")).body["degraded"] == []
        await redis_server.kill()

        async def degraded() -> Any:
            ready = await gw.operator("GET", "/readyz")
            return ready if ready.body["degraded"] == ["redis"] else None

        ready = await wait_until(degraded, 15, what="/readyz to name Redis")
        detail = await gw.operator("GET", "/v1/health")
        series = await degraded_series(gw)
    assert ready.status == 200 and ready.body["status"] == "degraded" and ready.body["redis"] == "unavailable"
    assert detail.body["status"] == "degraded" and detail.body["degraded"] == ["redis"]
    assert detail.body["checks"]["redis"]["state"] == "degraded"
    assert series["redis"] == 1.0 and series["database"] == 0.0


async def test_a_digest_sink_that_cannot_be_written_goes_stale(database_url: str, pki: PkiPaths, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "SEAL_MIN_SECONDS", 1.0)  # stale after max(1 s, 10 × 0.1 s)
    monkeypatch.setattr(health, "SLOW_DATABASE_SECONDS", 5.0)  # a loaded test machine is not a slow database
    generate_keypair(tmp_path / "seal.pem", tmp_path / "seal.pub")
    sink = tmp_path / "digests"
    async with running_gateway(database_url, pki, seal_key_file=tmp_path / "seal.pem", digest_dir=sink,
                               seal_interval_seconds=0.1) as gw:
        async def sealing() -> Any:
            detail = await gw.operator("GET", "/v1/health")
            check = detail.body["checks"]["digest_sink"]
            return check if check["state"] == "ok" and check["seconds"] is not None and "newest" in check[
                "detail"] else None

        await wait_until(sealing, 15, what="a seal in the sink")
        # The sink's directory becomes a file: every append fails from now on (even as root).
        shutil.rmtree(sink)
        sink.write_text("not a directory")

        async def stale() -> Any:
            detail = await gw.operator("GET", "/v1/health")
            return detail if detail.body["degraded"] == ["digest_sink"] else None

        detail = await wait_until(stale, 15, what="the digest sink to be reported stale")
        ready = await gw.operator("GET", "/readyz")
        series = await degraded_series(gw)
    assert detail.body["checks"]["digest_sink"]["seconds"] > 1.0
    assert ready.status == 200 and ready.body["degraded"] == ["digest_sink"]
    assert series["digest_sink"] == 1.0


async def test_a_slow_database_and_partitions_running_out_are_degraded(database_url: str, pki: PkiPaths,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_gateway(database_url, pki, metrics_sample_seconds=0.1) as gw:
        await sampled(gw)
        # Judged on what was measured: any round trip is slow above 0 s; two months of partitions
        # are too few when ten years are asked for.
        monkeypatch.setattr(health, "SLOW_DATABASE_SECONDS", 0.0)
        monkeypatch.setattr(health, "PARTITIONS_AHEAD_SECONDS", 10 * 365 * 86400)
        ready = await gw.operator("GET", "/readyz")
        detail = await gw.operator("GET", "/v1/health")
        series = await degraded_series(gw)
    assert ready.status == 200 and ready.body["degraded"] == ["database", "partitions"]
    assert "days ahead" in detail.body["checks"]["partitions"]["detail"]
    assert series["database"] == 1.0 and series["partitions"] == 1.0 and series["listen"] == 0.0


async def test_partitions_behind_now_are_degraded(database_url: str, pki: PkiPaths) -> None:
    """Real partitions that stop short: with the partitioner off and every time partition that
    reaches past now detached, the log's partitions reach no further than now."""
    async with running_gateway(database_url, pki, metrics_sample_seconds=0.1, partition_interval_seconds=0) as gw:
        async with gw.pool.connection() as conn:
            cur = await conn.execute("SELECT name FROM event_partitions WHERE NOT is_default AND upper_bound > now()")
            names = [name for (name,) in await cur.fetchall()]
        assert names
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as owner:
            for name in names:
                await owner.execute(f'ALTER TABLE events DETACH PARTITION "{name}"')

        async def degraded() -> Any:
            detail = await gw.operator("GET", "/v1/health")
            return detail if "partitions" in detail.body["degraded"] else None

        detail = await wait_until(degraded, 15, what="the partitions to be reported short")
    assert detail.body["checks"]["partitions"]["seconds"] <= 0
