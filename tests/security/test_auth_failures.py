"""Guessing operator API keys is throttled: per source address and per key prefix, at the API and
at the console's sign-in, a spent failure budget answers 429 (Retry-After) before the key is
looked up; a good key is unaffected until its source or prefix has spent its budget."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from leasehold.gateway.identity import FailureBudgets
from leasehold.gateway.keys import METRICS
from support.console import Browser
from support.gateway import ADMIN_KEY, RunningGateway, running_gateway


def sample(gw: RunningGateway, name: str, **labels: str) -> float:
    return gw.app[METRICS].registry.get_sample_value(name, labels) or 0.0


async def test_failed_api_keys_from_one_address_are_throttled_with_retry_after(database_url: str, pki: Any) -> None:
    async with running_gateway(database_url, pki, auth_failure_burst=3, auth_failures_per_minute=1) as gw:
        assert (await gw.operator("GET", "/v1/organizations")).status == 200  # a good key spends nothing
        for _ in range(3):  # three guesses, each with another prefix: the address's budget
            reply = await gw.operator("GET", "/v1/organizations", key="lh_" + secrets.token_urlsafe(32))
            assert reply.status == 401
        refused = await gw.operator("GET", "/v1/organizations", key="lh_" + secrets.token_urlsafe(32))
        assert refused.status == 429 and refused.headers["Content-Type"].startswith("application/problem+json")
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.body["type"].endswith("rate-limited")
        # The budget is the address's: the administrator's own key from it waits too.
        assert (await gw.operator("GET", "/v1/organizations", key=ADMIN_KEY)).status == 429
        assert sample(gw, "leasehold_auth_failures_total", door="api") == 3
        assert sample(gw, "leasehold_auth_throttled_total", door="api", budget="source") == 2


async def test_failed_console_sign_ins_are_throttled(database_url: str, pki: Any) -> None:
    async with running_gateway(database_url, pki, auth_failure_burst=2, auth_failures_per_minute=1) as gw:
        browser = Browser(gw)
        for _ in range(2):
            form = await browser.get("/console/sign-in")
            assert (await browser.post("/console/sign-in", {"csrf": form.csrf, "key": "lh_wrong"})).status == 401
        form = await browser.get("/console/sign-in")
        refused = await browser.post("/console/sign-in", {"csrf": form.csrf, "key": "lh_wrong-again"})
        assert refused.status == 429 and "Too many failed sign-ins" in refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        assert await gw.count("SELECT count(*) FROM console_sessions") == 0
        assert sample(gw, "leasehold_auth_failures_total", door="console") == 2
        assert sample(gw, "leasehold_auth_throttled_total", door="console", budget="source") == 1


def test_a_key_prefix_has_a_budget_of_its_own_across_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("leasehold.gateway.identity.time.monotonic", lambda: now[0])
    budgets = FailureBudgets(rate=1 / 60, burst=3)
    target = "lh_abcdefghiXYZ"
    for n in range(3):  # three addresses, each guessing the same key's prefix once
        assert budgets.blocked(f"10.0.0.{n}", target + str(n)) == (0.0, None)
        budgets.failed(f"10.0.0.{n}", target + str(n))
    wait, budget = budgets.blocked("10.0.0.9", target + "z")  # a fourth address, the same prefix
    assert budget == "prefix" and wait == pytest.approx(60)
    assert budgets.blocked("10.0.0.9", "lh_otherprefix") == (0.0, None)  # another prefix is free
    now[0] += 60  # one failure regained a minute later
    assert budgets.blocked("10.0.0.9", target + "z") == (0.0, None)
