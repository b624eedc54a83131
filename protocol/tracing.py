"""Distributed tracing with OpenTelemetry: off unless the standard ``OTEL_*`` variables turn it on.

One module for every process of the system (the Gateway, the worker agent, the operator client
and command line), so they agree on the switch and on how a trace crosses a process:

* **The switch.** Tracing is on in a process when ``OTEL_TRACES_EXPORTER`` names an exporter
  (``otlp``, or ``console`` to print spans) and ``OTEL_SDK_DISABLED`` is not ``true``. Unset
  (the default) or ``none``: off, and nothing of OpenTelemetry is imported. The exporter
  (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, headers, timeout),
  the sampler (``OTEL_TRACES_SAMPLER``, ``OTEL_TRACES_SAMPLER_ARG``), the batching
  (``OTEL_BSP_*``) and the resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``) are
  read by the SDK itself, as the specification says. The OTLP exporter speaks protobuf over HTTP.
* **Installing.** The SDK and the exporter are the ``tracing`` extra (``pip install
  leasehold[tracing]``; the ``server`` extra includes it). A worker host installed without it
  runs as before; with the switch on and the packages missing, the process logs one warning and
  runs untraced.
* **Off costs one check.** :func:`span` returns a shared do-nothing context manager while
  :func:`enabled` is false; :func:`traceparent` and :func:`trace_id` return None.
* **Across processes**: the W3C ``traceparent`` header (:func:`inject`, :func:`span` with
  ``parent=``). A stored ``traceparent`` (a task's creation) parents work done later, elsewhere.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

__all__ = [
    "TRACEPARENT",
    "add_event",
    "configure",
    "enabled",
    "inject",
    "requested",
    "reset",
    "span",
    "trace_id",
    "trace_id_of",
    "traceparent",
]

log = logging.getLogger("leasehold.tracing")

#: The W3C Trace Context header, and the plugin's environment variable of the same name.
TRACEPARENT = "traceparent"

_tracer: Any = None  # an opentelemetry Tracer while tracing is on
_provider: Any = None  # the TracerProvider this module made (shut down by reset)
_otel: Any = None  # the opentelemetry modules, imported on first use (see _modules)
_NOTHING: AbstractContextManager[None] = nullcontext()


def requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for tracing (``OTEL_TRACES_EXPORTER`` set, not ``none``,
    and ``OTEL_SDK_DISABLED`` not ``true``)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = [e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()]
    return bool(exporters) and exporters != ["none"]


def enabled() -> bool:
    return _tracer is not None


class _Modules:
    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.context, self.trace = context, trace
        self.propagator = TraceContextTextMapPropagator()


def _modules() -> _Modules:
    global _otel
    if _otel is None:
        _otel = _Modules()
    return _otel


def configure(service_name: str, *, provider: Any = None, environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on for this process when the environment asks for it (or when a
    ``provider``, an SDK ``TracerProvider``, is given: tests); True when it is on.

    The provider is this module's own, not OpenTelemetry's global one: a library embedding the
    client keeps its own tracing set-up. Context (the current span) is OpenTelemetry's, so spans
    of an embedding application parent ours and the other way round."""
    global _tracer, _provider
    if provider is None:
        if not requested(environ):
            return False
        try:
            provider = _sdk_provider(service_name, os.environ if environ is None else environ)
        except ImportError as exc:
            log.warning("tracing is asked for (OTEL_TRACES_EXPORTER) but OpenTelemetry is not installed "
                        "(pip install 'leasehold[tracing]'); running untraced", extra={"error": str(exc)})
            return False
        _provider = provider
    _tracer = provider.get_tracer("leasehold")
    _modules()
    return True


def reset() -> None:
    """Tracing off again; spans still buffered by a provider this module made are exported first."""
    global _tracer, _provider
    _tracer = None
    if _provider is not None:
        provider, _provider = _provider, None
        provider.shutdown()


def _sdk_provider(service_name: str, env: Mapping[str, str]) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
    provider = TracerProvider(resource=Resource.create(attributes))  # the sampler: OTEL_TRACES_SAMPLER
    for name in {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",")} - {"", "none"}:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        else:
            log.warning("unknown OTEL_TRACES_EXPORTER entry ignored (known: otlp, console, none)",
                        extra={"exporter": name})
    return provider


def span(name: str, *, kind: str = "internal", parent: str | None = None, headers: Mapping[str, str] | None = None,
         links: Iterable[str | None] = (), attributes: Mapping[str, Any] | None = None,
         child_only: bool = False) -> AbstractContextManager[Any]:
    """A span around a block, current inside it (a do-nothing block while tracing is off).

    ``parent``: a ``traceparent`` to continue instead of the current span (a stored one);
    ``headers``: a request's headers to continue from (their ``traceparent``); ``links``:
    ``traceparent``\\ s of spans this one follows from without being their child.
    ``kind``: ``server``, ``client``, ``internal``, ``producer`` or ``consumer``. ``child_only``:
    no span unless one is current (a step of a request, not of a background loop)."""
    if _tracer is None:
        return _NOTHING
    if child_only and not _otel.trace.get_current_span().get_span_context().is_valid:
        return _NOTHING
    return _span(name, kind, parent, headers, links, attributes)


@contextmanager
def _span(name: str, kind: str, parent: str | None, headers: Mapping[str, str] | None,
          links: Iterable[str | None], attributes: Mapping[str, Any] | None) -> Iterator[Any]:
    otel = _otel
    context = None
    if parent is not None:
        context = otel.propagator.extract({TRACEPARENT: parent})
    elif headers is not None:
        found = headers.get(TRACEPARENT)
        context = otel.propagator.extract({TRACEPARENT: found}) if found else otel.context.Context()
    linked = []
    for link in links:
        if link:
            linked_context = otel.trace.get_current_span(otel.propagator.extract({TRACEPARENT: link})).get_span_context()
            if linked_context.is_valid:
                linked.append(otel.trace.Link(linked_context))
    with _tracer.start_as_current_span(name, context=context, kind=otel.trace.SpanKind[kind.upper()],
                                       links=linked, attributes=dict(attributes or {})) as current:
        yield current


def add_event(name: str, attributes: Mapping[str, Any]) -> None:
    """Add an event to the current span (nothing while tracing is off or no span records)."""
    if _tracer is not None:
        _otel.trace.get_current_span().add_event(name, dict(attributes))


def inject(headers: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Add the current span's ``traceparent`` to ``headers`` (nothing while there is none)."""
    found = traceparent()
    if found is not None:
        headers[TRACEPARENT] = found
    return headers


def traceparent() -> str | None:
    """The current span's W3C ``traceparent`` (None: tracing off, or no span)."""
    if _otel is None:
        return None
    context = _otel.trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def trace_id() -> str | None:
    """The current span's trace id (32 hex digits) when it is sampled (recorded and exported),
    else None: an id that leads to no stored trace is not worth recording."""
    if _tracer is None:
        return None
    context = _otel.trace.get_current_span().get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    return f"{context.trace_id:032x}"


def trace_id_of(parent: str | None) -> str | None:
    """The trace id of a ``traceparent`` (None when it is not one)."""
    if not parent:
        return None
    parts = parent.split("-")
    if len(parts) < 4 or len(parts[1]) != 32:
        return None
    return parts[1]
