"""The dashboard (``deploy/grafana``) and the alert rules (``deploy/prometheus``) that ship: every
metric and every label they query is one a running Gateway serves on ``/metrics``; the rules pass
``promtool check rules`` and their unit tests (``promtool test rules``)."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from leasehold.gateway.tls import PkiPaths
from leasehold.persistence.seals import generate_keypair
from support.gateway import ADMIN_KEY, RunningGateway, running_gateway
from support.promql import uses
from support.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "leasehold-gateway.json"
RULES = ROOT / "deploy" / "prometheus" / "leasehold-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "leasehold-rules.test.yml"
#: Labels Prometheus gives every series it scrapes (the target's), whatever the Gateway serves.
TARGET_LABELS = frozenset({"job", "instance"})
#: Series Prometheus makes itself for every target it scrapes.
PROMETHEUS_SERIES: dict[str, set[str]] = {"up": set()}
#: Samples of a family besides its own name, by type (what PromQL may select).
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "summary": ("", "_count", "_sum", "_created"), "gauge": ("",), "info": ("_info",),
            "unknown": ("",)}

#: The background loops a Gateway with sealing runs (each with a pass timestamp).
LOOPS = ("sweeper", "sampler", "seals", "partitions", "scheduler", "webhooks")

Catalogue = dict[str, set[str]]  # selectable series name -> label names it may carry


def declared_labels() -> dict[str, tuple[str, ...]]:
    """Label names of every family the Gateway declares (``scripts/docs_reference.py``, which the
    metrics reference page is made from): a labelled family without a sample yet has its names."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    import docs_reference

    return {name: labels for name, (_, _, labels, _) in docs_reference.gateway_families().items()}


def catalogue_of(text: str, declared: dict[str, tuple[str, ...]]) -> Catalogue:
    """What a scrape of ``text`` lets PromQL select: each series name with its label names."""
    out: Catalogue = {name: set(labels) for name, labels in PROMETHEUS_SERIES.items()}
    for family in text_string_to_metric_families(text):
        labels = set(declared.get(family.name, ())) | set(declared.get(family.name + "_total", ()))
        for sample in family.samples:
            labels.update(sample.labels)
        for suffix in SUFFIXES.get(family.type, ("",)):
            out[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def problems(expression: str, catalogue: Catalogue) -> list[str]:
    """What ``expression`` queries that ``catalogue`` lacks: unknown metrics, unknown labels."""
    found = uses(expression)
    out = [f"unknown metric {name}" for name in sorted(found.metrics) if name not in catalogue]
    for name, labels in sorted(found.selector_labels.items()):
        if name not in catalogue:
            continue  # reported above
        for label in sorted(labels - catalogue.get(name, set()) - TARGET_LABELS):
            out.append(f"unknown label {label} on {name}")
    known = set(TARGET_LABELS).union(*(catalogue.get(name, set()) for name in found.metrics))
    out += [f"unknown label {label}" for label in sorted(found.grouping_labels - known)]
    return out


def dashboard_expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(where, expression)`` of every panel query and every template variable query."""
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))
    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            yield f"variable {variable['name']}", query["query"] if isinstance(query, dict) else query
            yield f"variable {variable['name']} definition", variable["definition"]


def rule_expressions(rules: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for group in rules["groups"]:
        for rule in group["rules"]:
            yield f"{group['name']}/{rule.get('alert') or rule.get('record')}", rule["expr"]


def everything_shipped() -> list[tuple[str, str]]:
    return [*dashboard_expressions(json.loads(DASHBOARD.read_text())),
            *rule_expressions(yaml.safe_load(RULES.read_text()))]


async def scrape(gw: RunningGateway) -> str:
    """``/metrics`` as Prometheus scrapes it: with the administrator key (see the notes)."""
    ctx = ssl.create_default_context(cafile=str(gw.pki.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session, \
            session.get(gw.operator_url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as r:
        assert r.status == 200
        return await r.text()


def value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


# --- the checker itself, on a catalogue written out here -------------------------------------

SMALL = {"leasehold_queue_depth": {"state"}, "leasehold_organization_queue_depth": {"organization", "state"},
         "leasehold_acquire_duration_seconds_bucket": {"outcome", "le"}, "up": set()}


def test_the_checker_reports_a_misspelt_metric_or_label() -> None:
    assert problems('sum by (state) (leasehold_queue_depth{job="leasehold", state="pending"})', SMALL) == []
    assert problems("histogram_quantile(0.95, sum by (outcome, le) "
                    "(rate(leasehold_acquire_duration_seconds_bucket[$__rate_interval])))", SMALL) == []
    assert problems('label_values(leasehold_organization_queue_depth{job=~"$job"}, organization)', SMALL) == []
    assert problems("time() - max(leasehold_queue_depth offset 5m) > 0 and on () up == 0", SMALL) == []
    assert problems('leasehold_queue_depht{state="pending"}', SMALL) == ["unknown metric leasehold_queue_depht"]
    assert problems('leasehold_queue_depth{stat="pending"}', SMALL) == [
        "unknown label stat on leasehold_queue_depth"]
    assert problems("sum by (organisation) (leasehold_organization_queue_depth)", SMALL) == [
        "unknown label organisation"]
    assert problems('label_values(leasehold_queue_depth, organization)', SMALL) == ["unknown label organization"]
    # A word inside a string or a matcher's regex is not a metric; one outside is.
    assert problems('leasehold_queue_depth{state=~"pending|leasehold_nothing"}', SMALL) == []
    assert problems("rate(leasehold_nothing_total[5m]) / leasehold_queue_depth", SMALL) == [
        "unknown metric leasehold_nothing_total"]


# --- against a running Gateway -----------------------------------------------------------------


async def test_the_dashboard_and_the_alert_rules_query_only_what_a_gateway_serves(
        database_url: str, pki: PkiPaths, redis_server: Any, tmp_path: Path) -> None:
    generate_keypair(tmp_path / "seal.pem", tmp_path / "seal.pub")
    async with running_gateway(database_url, pki, metrics_sample_seconds=0.1, redis_url=redis_server.url,
                               seal_key_file=tmp_path / "seal.pem", digest_dir=tmp_path / "digests",
                               seal_interval_seconds=0.2) as gw:
        # A little real work, so the labelled families have series: leases, an empty acquire,
        # a stale write refused, a malformed request.
        for _ in range(3):
            await gw.task()
        worker = await gw.worker(capacity=1)
        lease = (await worker.acquire()).body["lease"]
        assert (await worker.acquire()).status == 204
        stale = await worker.post(f"/v1/tasks/{lease['task']['id']}/attempts/{lease['attempt_id']}/renew",
                                  {"lease_token": "x" * 43})
        assert stale.status in (409, 422), stale.body
        assert (await worker.post("/v1/tasks/acquire", raw=b"{not json")).status == 400

        async def settled() -> str | None:
            text = await scrape(gw)
            passed = [value(text, "leasehold_background_last_pass_timestamp_seconds", loop=loop)
                      for loop in LOOPS]
            sealed = value(text, "leasehold_last_seal_timestamp_seconds")
            pending = value(text, "leasehold_organization_queue_depth", organization=str(gw.org), state="pending")
            return text if all(passed) and sealed and pending == 2 else None

        text = await wait_until(settled, 20, what="the loops to pass, a seal and the queue to be sampled")
    catalogue = catalogue_of(text, declared_labels())
    # The new series say what they claim: recent passes, a seal made just now.
    now = time.time()
    for loop in LOOPS:
        passed = value(text, "leasehold_background_last_pass_timestamp_seconds", loop=loop)
        assert passed is not None and now - 60 < passed <= now + 1, (loop, passed)
    sealed = value(text, "leasehold_last_seal_timestamp_seconds")
    assert sealed is not None and now - 60 < sealed <= now + 1
    assert "leasehold_redis_connected" in catalogue and "leasehold_cancellation_leg_seconds_bucket" in catalogue

    shipped = everything_shipped()
    assert len(shipped) > 30
    found = {where: problems(expression, catalogue) for where, expression in shipped}
    assert not {where: p for where, p in found.items() if p}, found
    # The same check, on the live catalogue, reports a misspelt metric and a wrong label.
    assert problems("sum(rate(leasehold_lease_expiry_total[5m]))", catalogue) == [
        "unknown metric leasehold_lease_expiry_total"]
    assert problems('max by (org) (leasehold_organization_queue_depth{state="pending"})', catalogue) == [
        "unknown label org"]
    assert problems('leasehold_lifecycle_transitions_total{events="TaskLeased"}', catalogue) == [
        "unknown label events on leasehold_lifecycle_transitions_total"]


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] and dashboard["title"]
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_alert_has_a_severity_a_summary_and_a_unit_test() -> None:
    rules = yaml.safe_load(RULES.read_text())
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tested: dict[str, set[str]] = {}
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            tested.setdefault(check["alertname"], set()).add("fires" if check.get("exp_alerts") else "quiet")
    alerts = [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]
    assert alerts
    for rule in alerts:
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        # Each alert is shown to fire when it should and to stay quiet when it should not.
        assert tested.get(rule["alert"]) == {"fires", "quiet"}, (rule["alert"], tested.get(rule["alert"]))


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian's prometheus package; .ci/install-observability)")
    return found


def test_promtool_checks_the_rules() -> None:
    run = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    run = subprocess.run([_promtool(), "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


#: What Grafana puts in place of the dashboard's variables before it sends a query.
GRAFANA_VALUES = {"$__rate_interval": "5m", "$job": ".+", "$organization": ".+"}


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Each panel query, its variables replaced as Grafana would, is valid PromQL: promtool
    checks it as a recording rule (a typo such as an unclosed brace fails here)."""
    rules = []
    for n, (_, expression) in enumerate(dashboard_expressions(json.loads(DASHBOARD.read_text()))):
        if expression.lstrip().startswith("label_values("):
            continue  # Grafana's own template function, not PromQL
        for variable, replacement in GRAFANA_VALUES.items():
            expression = expression.replace(variable, replacement)
        assert "$" not in expression, expression
        rules.append({"record": f"leasehold:dashboard_query_{n}", "expr": expression})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{len(rules)} rules found" in run.stdout


def test_promtool_unit_tests_fail_on_a_broken_rule(tmp_path: Path) -> None:
    """The unit tests can fail: with one alert's threshold raised out of reach, they do."""
    rules = RULES.read_text()
    assert "> 900\n" in rules
    (tmp_path / RULES.name).write_text(rules.replace("> 900\n", "> 90000\n", 1))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    run = subprocess.run([_promtool(), "test", "rules", RULE_TESTS.name], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "LeaseholdQueueAgeHigh" in run.stdout + run.stderr
