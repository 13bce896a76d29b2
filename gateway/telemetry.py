"""OpenTelemetry tracing for the gateway, built per app and never installed globally.

Contract:

* ``build_tracer_provider`` returns a fresh ``TracerProvider``; nothing here calls
  ``trace.set_tracer_provider``, registers an atexit hook or uses a global meter provider.
  The app that builds the provider owns it and calls ``shutdown`` when it stops.
* Export: an explicit ``exporter`` wins (one ``SimpleSpanProcessor``). Otherwise the usual
  variables, read from ``environ`` (default ``os.environ``): ``OTEL_SDK_DISABLED=true`` or
  ``OTEL_TRACES_EXPORTER=none`` export nothing; ``otlp`` (the default when an
  ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` is set) batches to OTLP/HTTP; ``console`` batches
  to stdout; no variable exports nothing. Spans exist either way, so ``traceparent`` still
  propagates. An unknown exporter name raises ``ValueError``.
* The SDK itself reads ``os.environ`` (not ``environ``) for the resource
  (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``), the sampler (``OTEL_TRACES_SAMPLER``),
  ``OTEL_SDK_DISABLED`` (its tracers become no-ops) and the OTLP endpoint, headers and timeout.
  ``service.name`` defaults to ``model-optimizer-gateway``.
* ``inject_trace_headers`` writes W3C ``traceparent``/``tracestate`` for vLLM with the W3C
  propagator itself, whatever ``OTEL_PROPAGATORS`` says.
* ``instrument_asgi`` wraps an app (pure ASGI: streamed bodies pass message by message) so each
  request gets a server span that joins an incoming ``traceparent``; ``/metrics`` and
  ``/healthz`` are not traced (gateway/server_span.py; OpenTelemetry's ASGI instrumentation
  did this at six times the CPU). Incoming context is extracted with OpenTelemetry's global
  propagator (W3C trace context and baggage unless ``OTEL_PROPAGATORS`` says otherwise).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping, MutableMapping, Sequence

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp

from gateway.server_span import ServerSpans

DEFAULT_SERVICE_NAME = "model-optimizer-gateway"
UNTRACED_PATHS = ("/metrics", "/healthz")
EXPORTERS = ("otlp", "console", "none")

ATTR_CLASS = "gateway.route.class"
ATTR_TIER = "gateway.route.tier"
ATTR_REASON = "gateway.route.reason"
ATTR_INPUT_TOKENS = "gen_ai.usage.input_tokens"
ATTR_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
ATTR_TTFT = "gateway.time_to_first_token_ms"
ATTR_FALLBACKS = "gateway.route.fallbacks"
ATTR_PINNED = "gateway.route.pinned"
ATTR_P_PRECISE = "gateway.route.p_precise"
# The request's outcome: the HTTP status, or what ended a stream sent as 200 (its failure's
# status; 499 when the client left).
ATTR_OUTCOME = "gateway.response.status_code"

# Stateless: the W3C propagator holds no configuration.
TRACE_CONTEXT = TraceContextTextMapPropagator()


def build_tracer_provider(
    exporter: SpanExporter | None = None, *, environ: Mapping[str, str] | None = None
) -> TracerProvider:
    """A provider exporting to ``exporter``, or to what the ``OTEL_*`` variables ask for."""
    if exporter is not None:
        processors: list[SpanProcessor] = [SimpleSpanProcessor(exporter)]
    else:
        processors = span_processors_from_env(os.environ if environ is None else environ)
    provider = TracerProvider(
        resource=gateway_resource(), shutdown_on_exit=False, meter_provider=NoOpMeterProvider()
    )
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def gateway_resource() -> Resource:
    """The SDK's resource from the environment, named ``model-optimizer-gateway`` by default."""
    resource = Resource.create()
    # The SDK falls back to "unknown_service:<executable>" when nothing names the service.
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters the variables ask for (``none`` dropped); ``ValueError`` if one is unknown."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not raw:
        endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        return ["otlp"] if any(environ.get(name, "").strip() for name in endpoints) else []
    names = list(dict.fromkeys(name.strip().lower() for name in raw.split(",") if name.strip()))
    for name in names:
        if name not in EXPORTERS:
            expected = ", ".join(EXPORTERS)
            raise ValueError(f"OTEL_TRACES_EXPORTER: unknown exporter {name!r} (use {expected})")
    return [name for name in names if name != "none"]


def span_processors_from_env(environ: Mapping[str, str]) -> list[SpanProcessor]:
    """One batching processor per exporter named by the variables (none for ``none``)."""
    return [_batching_processor(name) for name in exporter_names(environ)]


def _batching_processor(name: str) -> SpanProcessor:
    no_meters = NoOpMeterProvider()
    exporter: SpanExporter
    if name == "otlp":
        # Reads OTEL_EXPORTER_OTLP_[TRACES_]{ENDPOINT,HEADERS,TIMEOUT,...} itself.
        exporter = OTLPSpanExporter(meter_provider=no_meters)
    else:
        # The SDK's default ``out`` is the sys.stdout of import time; use today's.
        exporter = ConsoleSpanExporter(out=sys.stdout)
    return BatchSpanProcessor(exporter, meter_provider=no_meters)


def inject_trace_headers(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Write ``traceparent`` (and ``tracestate``) for the span in ``context`` (default: current).

    Any trace headers already present (in any letter case) are replaced, so a client's stale
    ``tracestate`` never travels with the gateway's ``traceparent``. Without a valid span,
    ``headers`` is left as it is.
    """
    fresh: dict[str, str] = {}
    TRACE_CONTEXT.inject(fresh, context=context)
    if not fresh:
        return
    for key in [key for key in headers if key.lower() in TRACE_CONTEXT.fields]:
        del headers[key]
    headers.update(fresh)


def instrument_asgi(app: ASGIApp, provider: TracerProvider, routes: Sequence[str] = ()) -> ASGIApp:
    """``app`` behind a server span per HTTP request (gateway/server_span.py), named after
    ``routes`` it matches, except for ``UNTRACED_PATHS``."""
    tracer = provider.get_tracer("model_optimizer.gateway.server")
    return ServerSpans(app, tracer, routes, UNTRACED_PATHS)


def shutdown(provider: TracerProvider, timeout: float = 5.0) -> bool:
    """Flush pending spans and shut the provider down; ``True`` if done within ``timeout`` s.

    Runs in a daemon thread so a collector that does not answer cannot hold the process;
    this call blocks its caller for at most ``timeout`` seconds.
    """

    def flush_then_stop() -> None:
        provider.force_flush(int(timeout * 1000))
        provider.shutdown()

    worker = threading.Thread(target=flush_then_stop, name="otel-shutdown", daemon=True)
    worker.start()
    worker.join(timeout)
    return not worker.is_alive()
