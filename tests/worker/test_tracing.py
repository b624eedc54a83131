"""Tracing end to end: one trace from the operator's request through the Gateway to the agent (a
``leasehold worker run`` subprocess exporting OTLP/HTTP to a receiver in this test), its plugin
and its batch uploads; the trace ids on the attempt's events and in the auditor's timeline."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from leasehold.client import OperatorClient
from leasehold.domain import events as ev
from leasehold.persistence.codec import decode_event
from leasehold.protocol import tracing
from leasehold.replay.timeline import task_timeline
from support.agent import agent_process, python_plugin, records, register_worker, rows, wait_state
from support.gateway import ADMIN_KEY, RunningGateway


@dataclass(frozen=True)
class Span:
    """A finished span, from either exporter: ids as hex, the parent's span id or None."""

    name: str
    trace_id: str
    span_id: str
    parent: str | None
    links: tuple[tuple[str, str], ...]  # (trace id, span id)
    attributes: dict[str, Any]
    process: str
    events: tuple[str, ...] = ()  # the domain events a transaction span appended


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[tuple[str, list[Span]]]:
    """An OTLP/HTTP trace receiver (protobuf) on 127.0.0.1: its URL and the spans it received."""
    received: list[Span] = []

    async def export(request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource in message.resource_spans:
            service = next((a.value.string_value for a in resource.resource.attributes if a.key == "service.name"), "")
            for scope in resource.scope_spans:
                for s in scope.spans:
                    received.append(Span(
                        s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex() or None,
                        tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                        {a.key: _value(a.value) for a in s.attributes}, service))
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", export)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces", received
    finally:
        await runner.cleanup()


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


@pytest.fixture
def traced() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process (the operator client and the in-process Gateway), every trace
    sampled, spans kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure("test", provider=provider)
    try:
        yield exporter
    finally:
        tracing.reset()
        provider.shutdown()


def in_memory(exporter: InMemorySpanExporter) -> list[Span]:
    return [Span(s.name, f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}",
                 f"{s.parent.span_id:016x}" if s.parent else None,
                 tuple((f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in s.links),
                 dict(s.attributes or {}), "gateway",
                 tuple(name for e in s.events for name in (e.attributes or {}).get("leasehold.events", ())))
            for s in exporter.get_finished_spans()]


async def test_one_trace_spans_operator_request_gateway_agent_plugin_and_batches(
        gateway: RunningGateway, plugins_dir: Path, tmp_path: Path, traced: InMemorySpanExporter) -> None:
    # Two records 1.2 s apart: a batch upload before the final one (batch_seconds 0.2).
    python_plugin(plugins_dir, "traced", """
        import json, os, time
        print(json.dumps({"type": "raw", "traceparent": os.environ.get("TRACEPARENT")}), flush=True)
        time.sleep(1.2)  # past the batch timer (batch_seconds 0.2), even on a busy box
        print(json.dumps({"type": "raw", "n": 2}), flush=True)
    """)
    worker = await register_worker(gateway, ("traced",))
    async with otlp_receiver() as (endpoint, agent_spans):
        env = {**os.environ, "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
               "OTEL_TRACES_SAMPLER": "parentbased_always_on", "OTEL_BSP_SCHEDULE_DELAY": "100"}
        argv = worker.argv(gateway, plugins_dir=plugins_dir, wait_seconds=2)
        async with agent_process(argv, tmp_path / "agent.log", env=env) as agent:
            async with OperatorClient(gateway.operator_url, ADMIN_KEY, ca_file=str(gateway.pki.ca_cert)) as client:
                created = await client.create_task(gateway.scan, "traced", scope={"targets": ["127.0.0.1"]})
            await wait_state(gateway, created.id, "completed", "failed_terminal", within=30)
            agent.process.send_signal(signal.SIGTERM)  # a stopping agent exports what it still holds
            assert await asyncio.wait_for(agent.process.wait(), 30) == 0, agent.log_text()[-3000:]
        assert (await rows(gateway, "SELECT state FROM worker_tasks WHERE id = %s", created.id)) == [("completed",)]

    spans = in_memory(traced) + agent_spans
    by_id = {s.span_id: s for s in spans}

    def one(name: str, **where: Any) -> Span:
        found = [s for s in spans if s.name == name and all(getattr(s, k) == v for k, v in where.items())]
        assert len(found) == 1, (name, where, found)
        return found[0]

    def children(parent: Span, name: str) -> list[Span]:
        return [s for s in spans if s.parent == parent.span_id and s.name == name]

    # operator request -> Gateway request -> its command transaction
    request = one("POST", parent=None)
    trace = request.trace_id
    served = one("POST /v1/scans/{scan_id}/tasks", parent=request.span_id)
    [created_in] = [t for t in children(served, "transaction") if "TaskCreated" in t.events]
    # -> the agent's run of the attempt (parent: the transaction that created the task), linked to
    # the acquire long-poll that leased it (a trace of its own, which the Gateway's acquire joins)
    run = one("task run", parent=created_in.span_id)
    assert run.trace_id == trace and run.process == "leasehold-worker"
    assert run.attributes["leasehold.task_id"] == str(created.id)
    assert run.attributes["leasehold.outcome"] == "completed"
    [(acquire_trace, acquire_span)] = run.links
    acquire = by_id[acquire_span]
    assert acquire.name == "acquire" and acquire.trace_id == acquire_trace != trace
    assert children(acquire, "POST /v1/tasks/acquire")
    # -> the plugin (which got its span as TRACEPARENT) -> its batch uploads -> the Gateway's writes
    [plugin] = children(run, "plugin run")
    first = (await records(gateway, created.id))[0]
    assert first["traceparent"].startswith(f"00-{trace}-{plugin.span_id}-")  # then the sampled flag: 01 or 03
    uploads = children(plugin, "batch upload")
    assert [u.attributes["leasehold.final"] for u in uploads] == [False, True], uploads
    for upload in uploads:
        action = "complete" if upload.attributes["leasehold.final"] else "results"
        [write] = children(upload, f"POST /v1/tasks/{{task_id}}/attempts/{{attempt_id}}/{action}")
        [recorded] = [t for t in children(write, "transaction") if "ResultBatchAccepted" in t.events]
        assert ("TaskCompleted" in recorded.events) == upload.attributes["leasehold.final"]
    assert all(s.trace_id == trace for s in (served, created_in, run, plugin, *uploads))

    # The trace ids on the record: the creation's context, the lease (the acquire's trace), the
    # batches and the completion (the task's trace); the timeline shows them.
    async with gateway.pool.connection() as conn:
        stored = await (await conn.execute(
            "SELECT originator_id, originator_version, topic, state FROM events WHERE originator_id = %s"
            " ORDER BY originator_version", (created.id,))).fetchall()
        timeline = await task_timeline(conn, created.id)
    events = [decode_event(*row) for row in stored]
    [creation] = [e for e in events if isinstance(e, ev.TaskCreated)]
    assert creation.traceparent is not None and creation.traceparent.startswith(f"00-{trace}-{created_in.span_id}-")
    [leased] = [e for e in events if isinstance(e, ev.TaskLeased)]
    assert leased.trace_id == acquire_trace
    batches = [e for e in events if isinstance(e, ev.ResultBatchAccepted)]
    [completed] = [e for e in events if isinstance(e, ev.TaskCompleted)]
    assert len(batches) == 2 and {b.trace_id for b in batches} == {completed.trace_id} == {trace}
    lines = {entry.event_type: entry.summary for entry in timeline}
    assert lines["TaskCompleted"].endswith(f"trace={trace}")
    assert lines["TaskLeased"].endswith(f"trace={acquire_trace}")


async def test_tracing_off_records_no_trace_and_sends_no_traceparent(gateway: RunningGateway) -> None:
    """Off (the default): no span, no trace field on the events, the answers as before."""
    assert not tracing.enabled() and not tracing.requested({})
    assert tracing.requested({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not tracing.requested({"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing.requested({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
    assert not tracing.configure("test", environ={"OTEL_TRACES_EXPORTER": "none"}) and not tracing.enabled()
    with tracing.span("nothing") as span:
        assert span is None and tracing.traceparent() is None and tracing.trace_id() is None
    task_id = await gateway.task()
    [(state,)] = await rows(gateway, "SELECT state FROM events WHERE originator_id = %s AND originator_version = 1",
                            task_id)
    assert b"traceparent" not in bytes(state)


def test_the_switch_sets_up_the_sdk_from_the_environment_and_runs_untraced_without_it(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    try:
        assert tracing.configure("test", environ={"OTEL_TRACES_EXPORTER": "console"}) and tracing.enabled()
    finally:
        tracing.reset()
    assert not tracing.enabled()
    # Asked for, but the SDK is not installed (a worker host with the base package only).
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    assert not tracing.configure("test", environ={"OTEL_TRACES_EXPORTER": "otlp"}) and not tracing.enabled()
    assert "OpenTelemetry is not installed" in caplog.text
