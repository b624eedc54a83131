"""The reference pages generated from the code (``scripts/docs_reference.py``) leave nothing out:
every command, route, schema, setting, event class and metric family is on its page. The metrics
are checked against what a running Gateway actually serves, not only against its registries."""

from __future__ import annotations

import inspect
import ssl

import aiohttp
import pytest
from docs_support import docs_reference
from prometheus_client.parser import text_string_to_metric_families

from leasehold.domain import events
from leasehold.gateway.settings import GatewaySettings
from leasehold.gateway.tls import PkiPaths
from leasehold.worker.settings import WorkerSettings
from support.gateway import ADMIN_KEY, RunningGateway, running_gateway


def test_every_command_is_on_the_cli_page_with_its_whole_help() -> None:
    page = docs_reference.cli_page()
    helps = docs_reference.command_helps()
    assert "leasehold gateway serve" in helps and "leasehold replay verify-chain" in helps
    for prog, text in helps.items():
        assert f"{{ #{docs_reference.cli_anchor(prog)} }}" in page, prog
        assert text.rstrip("\n") in page, prog


def test_every_route_and_schema_is_on_the_http_api_page() -> None:
    document = docs_reference.openapi_document()
    page = docs_reference.http_api_page(document)
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert f"{{ #{docs_reference.operation_anchor(method.upper(), path)} }}" in page, (method, path)
            assert " ".join(operation["summary"].split()) in page, (method, path)
    for name in document["components"]["schemas"]:
        assert f"{{ #{docs_reference.schema_anchor(name)} }}" in page, name


def test_every_setting_is_on_the_settings_page_with_its_variable_and_default() -> None:
    page = docs_reference.settings_page()
    for name in GatewaySettings.model_fields:
        assert f"| **`{name}`**<br>`LEASEHOLD_{name.upper()}`" in page, name
    for name in WorkerSettings.model_fields:
        assert f"| **`{name}`**<br>`LEASEHOLD_WORKER_{name.upper()}`" in page, name
    assert "| **`worker_port`**<br>`LEASEHOLD_WORKER_PORT`<br>`--worker-port` | `int`<br>`8443` |" in page
    assert "`--listen` `--no-listen`" in page
    assert "| **`admin_api_key`**<br>`LEASEHOLD_ADMIN_API_KEY`<br>no flag (a secret) |" in page


def test_every_event_class_is_on_the_events_page_with_its_docstring() -> None:
    page = docs_reference.events_page()
    classes = [cls for cls in vars(events).values()
               if isinstance(cls, type) and issubclass(cls, events.DomainEvent) and cls is not events.DomainEvent]
    assert len(classes) > 30
    for cls in classes:
        assert f"### {cls.__name__}\n" in page, cls.__name__
        if cls.__doc__:
            assert inspect.getdoc(cls) in page, cls.__name__
    assert "## Task stream" in page


async def _served_families(gw: RunningGateway) -> set[str]:
    ctx = ssl.create_default_context(cafile=str(gw.pki.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session, \
            session.get(gw.operator_url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as r:
        assert r.status == 200
        text = await r.text()
    names = {f.name + ("_total" if f.type == "counter" else "") for f in text_string_to_metric_families(text)}
    # A counter's or histogram's creation times are served as a gauge family `<name>_created`.
    return {n for n in names if not (n.endswith("_created") and ({n[:-8], n[:-8] + "_total"} & names))}


async def _used(gw: RunningGateway) -> None:
    """One task through acquire, so that the labelled families have a sample each."""
    await gw.task()
    worker = await gw.worker(capacity=1)
    await worker.acquire()


async def test_every_family_a_running_gateway_serves_is_on_the_metrics_page(database_url: str, pki: PkiPaths) -> None:
    page = docs_reference.metrics_page()
    async with running_gateway(database_url, pki, metrics_sample_seconds=0.1) as gw:
        await _used(gw)
        served = await _served_families(gw)
    assert "leasehold_listen_connected" in served and "leasehold_connections_open" in served
    missing = sorted(name for name in served if f"| `{name}` |" not in page)
    assert not missing, missing


async def test_the_redis_hint_families_are_on_the_metrics_page(database_url: str, pki: PkiPaths,
                                                                 redis_server: object) -> None:
    page = docs_reference.metrics_page()
    async with running_gateway(database_url, pki, redis_url=redis_server.url) as gw:  # type: ignore[attr-defined]
        served = await _served_families(gw)
    hints = sorted(name for name in served if "hints" in name or "redis" in name)
    assert hints, served
    assert not [name for name in hints if f"| `{name}` |" not in page]


def test_the_worker_agent_families_are_on_the_metrics_page() -> None:
    page = docs_reference.metrics_page()
    for name in docs_reference.worker_families():
        assert f"| `{name}` |" in page, name
    assert "leasehold_worker_tasks_total" in page


@pytest.mark.parametrize("path", list(docs_reference.PAGES))
def test_each_generated_page_is_markdown_with_one_title(path: str) -> None:
    text = docs_reference.PAGES[path]()
    assert text.startswith("# ") and text.count("\n# ") == 0, path
