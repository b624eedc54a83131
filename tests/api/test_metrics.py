"""``/metrics``: queue depth by organisation and state, oldest pending age, lease expiries,
rejections by reason, build info, pool stats; acquire long-polls apart from request latency."""

from __future__ import annotations

import ssl

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from leasehold.gateway.tls import PkiPaths
from leasehold.migrations import runner as migrate
from support.gateway import ADMIN_KEY, RunningGateway, running_gateway
from support.waits import wait_until


async def samples(gw: RunningGateway, key: str | None = ADMIN_KEY) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as {(name, labels): value}; with the administrator key by default."""
    ctx = ssl.create_default_context(cafile=str(gw.pki.ca_cert))
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session, \
            session.get(gw.operator_url + "/metrics", headers=headers) as r:
        assert r.status == 200
        text = await r.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_gateway_metrics(database_url: str, pki: PkiPaths) -> None:
    async with running_gateway(database_url, pki, metrics_sample_seconds=0.1) as gw:
        org = str(gw.org)
        for _ in range(3):
            await gw.task()
        worker = await gw.worker(capacity=1)
        lease = (await worker.acquire()).body["lease"]
        empty = await worker.acquire()  # nothing else it may take: 204
        assert empty.status == 204
        stale = await worker.post(f"/v1/tasks/{lease['task']['id']}/attempts/{lease['attempt_id']}/renew",
                                  {"lease_token": "x" * 43})
        assert stale.status in (409, 422), stale.body
        malformed = await worker.post("/v1/tasks/acquire", raw=b"{not json")
        assert malformed.status == 400

        async def sampled() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            found = await samples(gw)
            pending = ("leasehold_organization_queue_depth", (("organization", org), ("state", "pending")))
            return found if found.get(pending) == 2 else None

        found = await wait_until(sampled, 10, what="the queue depth to be sampled")
        public = await samples(gw, key=None)
        an_organisation = await samples(gw, key=(await gw.operator(
            "POST", f"/v1/organizations/{org}/api-keys", {"name": "metrics"})).body["key"])
    assert found[("leasehold_organization_queue_depth", (("organization", org), ("state", "leased")))] == 1
    assert found[("leasehold_organization_oldest_pending_age_seconds", (("organization", org),))] >= 0
    # Without the administrator key: the totals by state, no series that names an organisation.
    assert public[("leasehold_queue_depth", (("state", "pending"),))] == 2
    assert public[("leasehold_queue_depth", (("state", "leased"),))] == 1
    assert public[("leasehold_oldest_pending_age_seconds", ())] >= 0
    for seen in (public, an_organisation):
        assert not [k for k in seen if k[0].startswith("leasehold_organization_")]
        assert not [k for k in seen if org in str(k)]
    assert found[("leasehold_live_leases", ())] == 1
    # Long-polls are measured apart: one leased, one empty; none in the request latency.
    assert found[("leasehold_acquire_duration_seconds_count", (("outcome", "leased"),))] == 1
    assert found[("leasehold_acquire_duration_seconds_count", (("outcome", "empty"),))] == 1
    assert not [k for k in found if k[0] == "leasehold_http_request_duration_seconds_count"
                and ("route", "/v1/tasks/acquire") in k[1]]
    rejections = {dict(k[1])["reason"]: v for k, v in found.items() if k[0] == "leasehold_rejections_total"}
    assert rejections.get("bad-request") == 1 and sum(rejections.values()) >= 2, rejections
    assert found[("leasehold_lease_expiries_total", ())] == 0
    build = [dict(k[1]) for k in found if k[0] == "leasehold_build_info"]
    assert len(build) == 1 and build[0]["schema_revision"] == migrate.head()
    assert found[("leasehold_db_pool_size", ())] >= 1
    assert ("leasehold_db_pool_requests_waiting", ()) in found
