"""Tracing: provider construction from OTEL_* variables, W3C header injection, ASGI server spans."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    SpanKind,
    StatusCode,
    TraceFlags,
    TraceState,
    format_span_id,
    format_trace_id,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.app import create_app
from gateway.config import GatewayConfig, TierEndpoint
from gateway.telemetry import (
    ATTR_TIER,
    DEFAULT_SERVICE_NAME,
    build_tracer_provider,
    inject_trace_headers,
    instrument_asgi,
    shutdown,
    span_processors_from_env,
)
from tests.integration.conftest import wait_until
from tests.stub_tier import MODEL

INCOMING_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
INCOMING_PARENT = "00f067aa0ba902b7"
WAIT = 5.0


@pytest.fixture(autouse=True)
def clean_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK reads os.environ itself: no OTEL_* variable of the caller's may leak in."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    built = build_tracer_provider(exporter)
    yield built
    built.shutdown()


def spans_named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


# --- the provider ------------------------------------------------------------------------


def test_in_memory_exporter_receives_spans(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with provider.get_tracer("test").start_as_current_span("route") as span:
        span.set_attribute(ATTR_TIER, "int8")
    (finished,) = exporter.get_finished_spans()
    assert finished.name == "route"
    assert finished.attributes == {ATTR_TIER: "int8"}
    assert finished.resource.attributes["service.name"] == DEFAULT_SERVICE_NAME
    # Nothing was installed globally.
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)


def test_resource_honours_otel_service_name_and_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gw-under-test")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci")
    attributes = build_tracer_provider(InMemorySpanExporter()).resource.attributes
    assert attributes["service.name"] == "gw-under-test"
    assert attributes["deployment.environment"] == "ci"


def test_service_name_in_resource_attributes_beats_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes")
    resource = build_tracer_provider(InMemorySpanExporter()).resource
    assert resource.attributes["service.name"] == "from-attributes"


def test_the_sdk_reads_the_sampler_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, exporter: InMemorySpanExporter
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    provider = build_tracer_provider(exporter)
    with provider.get_tracer("test").start_as_current_span("dropped") as span:
        assert not span.is_recording()
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_TRACES_EXPORTER": " none ", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
        {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"},
        {"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
    ],
)
def test_nothing_exports_when_the_variables_say_so(environ: dict[str, str]) -> None:
    assert span_processors_from_env(environ) == []


def test_spans_still_propagate_without_an_exporter() -> None:
    provider = build_tracer_provider(environ={"OTEL_TRACES_EXPORTER": "none"})
    headers: dict[str, str] = {}
    with provider.get_tracer("test").start_as_current_span("unexported") as span:
        inject_trace_headers(headers)
    assert headers["traceparent"].split("-")[1] == format_trace_id(span.get_span_context().trace_id)


@pytest.mark.parametrize(
    "environ",
    [
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"},
        {"OTEL_TRACES_EXPORTER": "otlp"},
        {"OTEL_TRACES_EXPORTER": "OTLP,none,otlp"},
    ],
)
def test_otlp_batches_when_asked_or_when_an_endpoint_is_set(environ: dict[str, str]) -> None:
    processors = span_processors_from_env(environ)
    try:
        assert len(processors) == 1
        assert isinstance(processors[0], BatchSpanProcessor)
        assert isinstance(processors[0].span_exporter, OTLPSpanExporter)
    finally:
        for processor in processors:
            processor.shutdown()


@pytest.mark.parametrize("name", ["jaeger", "otlp,zipkin", "otlp_grpc"])
def test_an_unknown_exporter_is_a_one_line_value_error(name: str) -> None:
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER") as raised:
        build_tracer_provider(environ={"OTEL_TRACES_EXPORTER": name})
    assert "\n" not in str(raised.value)


def test_console_exporter_prints_spans(capsys: pytest.CaptureFixture[str]) -> None:
    provider = build_tracer_provider(environ={"OTEL_TRACES_EXPORTER": "console"})
    with provider.get_tracer("test").start_as_current_span("printed-span"):
        pass
    assert shutdown(provider)
    assert '"name": "printed-span"' in capsys.readouterr().out


class Collector(BaseHTTPRequestHandler):
    """Accepts OTLP/HTTP exports and remembers their paths and headers."""

    seen: list[tuple[str, dict[str, str]]]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, dict[str, str]]]]]:
    seen: list[tuple[str, dict[str, str]]] = []
    handler = type("RecordingCollector", (Collector,), {"seen": seen})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_otlp_export_follows_the_endpoint_and_header_variables(
    monkeypatch: pytest.MonkeyPatch, collector: tuple[str, list[tuple[str, dict[str, str]]]]
) -> None:
    url, seen = collector
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=gateway")
    provider = build_tracer_provider()
    with provider.get_tracer("test").start_as_current_span("exported"):
        pass
    assert shutdown(provider, timeout=WAIT)
    assert [(path, headers.get("x-tenant")) for path, headers in seen] == [
        ("/v1/traces", "gateway")
    ]


# --- shutdown ----------------------------------------------------------------------------


def test_shutdown_flushes_batched_spans(exporter: InMemorySpanExporter) -> None:
    provider = build_tracer_provider(environ={})
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    with provider.get_tracer("test").start_as_current_span("pending"):
        pass
    assert exporter.get_finished_spans() == ()  # still queued
    assert shutdown(provider)
    assert [span.name for span in exporter.get_finished_spans()] == ["pending"]


class StuckProcessor(SpanProcessor):
    """A processor whose shutdown hangs until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def shutdown(self) -> None:
        self.release.wait(WAIT)


def test_shutdown_gives_up_after_its_timeout() -> None:
    provider = build_tracer_provider(environ={})
    stuck = StuckProcessor()
    provider.add_span_processor(stuck)
    try:
        assert shutdown(provider, timeout=0.05) is False
    finally:
        stuck.release.set()


# --- headers for vLLM --------------------------------------------------------------------


def test_inject_writes_the_active_spans_traceparent(provider: TracerProvider) -> None:
    headers = {"Traceparent": f"00-{INCOMING_TRACE}-{INCOMING_PARENT}-01", "tracestate": "old=1"}
    headers["content-type"] = "application/json"
    with provider.get_tracer("test").start_as_current_span("call-tier") as span:
        inject_trace_headers(headers)
    context = span.get_span_context()
    trace_id, span_id = format_trace_id(context.trace_id), format_span_id(context.span_id)
    # Flags come from the span: the SDK sets "sampled" and W3C level 2's "random" (0x03).
    flags = f"{context.trace_flags:02x}"
    assert headers == {
        "traceparent": f"00-{trace_id}-{span_id}-{flags}",
        "content-type": "application/json",
    }


def test_inject_uses_an_explicit_context_and_carries_tracestate() -> None:
    remote = trace.SpanContext(
        trace_id=int(INCOMING_TRACE, 16),
        span_id=int(INCOMING_PARENT, 16),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "abc")]),
    )
    headers: dict[str, str] = {}
    inject_trace_headers(headers, trace.set_span_in_context(trace.NonRecordingSpan(remote)))
    assert headers == {
        "traceparent": f"00-{INCOMING_TRACE}-{INCOMING_PARENT}-01",
        "tracestate": "vendor=abc",
    }


def test_inject_leaves_headers_alone_without_a_span() -> None:
    headers = {"traceparent": f"00-{INCOMING_TRACE}-{INCOMING_PARENT}-01"}
    inject_trace_headers(headers)
    assert headers == {"traceparent": f"00-{INCOMING_TRACE}-{INCOMING_PARENT}-01"}


# --- the ASGI server span ----------------------------------------------------------------

CHUNKS = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]


class ChunkRecorder:
    """Outermost ASGI layer: records body messages as the instrumented app sends them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.bodies: list[tuple[bytes, bool]] = []
        self.first_chunk_sent = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                self.bodies.append((message.get("body", b""), message.get("more_body", False)))
                if message.get("body"):
                    self.first_chunk_sent.set()
            await send(message)

        await self.app(scope, receive, recording_send)


def build_app(provider: TracerProvider) -> tuple[ChunkRecorder, dict[str, str]]:
    """A streaming endpoint that opens a child span; returns the wrapped app and its headers."""
    tier_headers: dict[str, str] = {}
    tracer = provider.get_tracer("test")

    async def stream(request: Request) -> Response:
        with tracer.start_as_current_span("route"):
            inject_trace_headers(tier_headers)

        async def body() -> AsyncIterator[bytes]:
            yield CHUNKS[0]
            # If anything buffered the stream, the first chunk would never leave: fail loudly.
            with anyio.fail_after(WAIT):
                await recorder.first_chunk_sent.wait()
            for chunk in CHUNKS[1:]:
                yield chunk

        return StreamingResponse(body(), media_type="text/event-stream")

    async def plain(request: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [
        Route("/v1/chat/completions", stream, methods=["POST"]),
        Route("/metrics", plain),
        Route("/healthz", plain),
        Route("/readyz", plain),
        Route("/admin/metrics", plain),
    ]
    paths = [route.path for route in routes]
    recorder = ChunkRecorder(instrument_asgi(Starlette(routes=routes), provider, paths))
    return recorder, tier_headers


async def drive(app: ASGIApp, requests: Sequence[tuple[str, str, dict[str, str]]]) -> list[bytes]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        bodies = []
        for method, path, headers in requests:
            response = await client.request(method, path, headers=headers)
            assert response.status_code == 200, path
            bodies.append(response.content)
        return bodies


def test_streaming_passes_through_and_is_traced(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    recorder, tier_headers = build_app(provider)
    (body,) = asyncio.run(drive(recorder, [("POST", "/v1/chat/completions", {})]))

    assert body == b"".join(CHUNKS)
    assert [chunk for chunk, more in recorder.bodies if chunk] == CHUNKS
    assert recorder.bodies[-1][1] is False
    (server,) = [span for span in exporter.get_finished_spans() if span.kind == SpanKind.SERVER]
    (child,) = spans_named(exporter, "route")
    assert server.name == "POST /v1/chat/completions"
    assert server.parent is None
    assert child.parent is not None and server.context is not None
    assert child.parent.span_id == server.context.span_id
    assert child.context is not None
    assert tier_headers["traceparent"].split("-")[1:3] == [
        format_trace_id(server.context.trace_id),
        format_span_id(child.context.span_id),
    ]
    # No span per ASGI message: the server span and the endpoint's own span, nothing else.
    assert len(exporter.get_finished_spans()) == 2


def test_an_incoming_traceparent_joins_the_callers_trace(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    recorder, _ = build_app(provider)
    incoming = {"traceparent": f"00-{INCOMING_TRACE}-{INCOMING_PARENT}-01"}
    asyncio.run(drive(recorder, [("POST", "/v1/chat/completions", incoming)]))

    (server,) = [span for span in exporter.get_finished_spans() if span.kind == SpanKind.SERVER]
    assert server.context is not None and server.parent is not None
    assert format_trace_id(server.context.trace_id) == INCOMING_TRACE
    assert format_span_id(server.parent.span_id) == INCOMING_PARENT
    assert server.parent.is_remote


def test_metrics_and_healthz_are_not_traced(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    recorder, _ = build_app(provider)
    paths = ["/metrics", "/healthz", "/readyz", "/admin/metrics"]
    asyncio.run(drive(recorder, [("GET", path, {}) for path in paths]))
    traced = [span.name for span in exporter.get_finished_spans()]
    assert traced == ["GET /readyz", "GET /admin/metrics"]


def test_server_spans_name_routes_and_nothing_else(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """Routes by their template; any other path by the method alone (no unbounded names); the
    request's attributes; a 5xx marks the span as an error."""

    async def fail(request: Request) -> Response:
        return PlainTextResponse("down", status_code=503)

    routes = [Route("/admin/tiers/{tier}/restore", fail, methods=["POST"])]
    app = instrument_asgi(Starlette(routes=routes), provider, [r.path for r in routes])

    async def run() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            restore = await client.post("/admin/tiers/int8/restore", headers={"user-agent": "ua"})
            assert restore.status_code == 503
            assert (await client.get("/no/such/path/12345")).status_code == 404

    asyncio.run(run())
    restore, unknown = exporter.get_finished_spans()
    assert (restore.name, unknown.name) == ("POST /admin/tiers/{tier}/restore", "GET")
    assert restore.kind == SpanKind.SERVER
    assert dict(restore.attributes or {}) == {
        "http.request.method": "POST",
        "url.path": "/admin/tiers/int8/restore",
        "url.scheme": "http",
        "http.route": "/admin/tiers/{tier}/restore",
        "client.address": "127.0.0.1",
        "user_agent.original": "ua",
        "http.response.status_code": 503,
    }
    assert restore.status.status_code == StatusCode.ERROR
    assert unknown.status.status_code != StatusCode.ERROR  # a 404 is the client's
    assert "http.route" not in (unknown.attributes or {})


@pytest.mark.parametrize("mode", ["whole", "stream", "stream_dies"])
def test_the_route_is_written_on_the_server_span(
    mode: str, make_stub: Any, start_server: Any
) -> None:
    """A completion request makes one server span carrying the route (no ``gateway.request``
    span), with the ``upstream`` exchange as its child; a stream that fails after its 200 keeps
    the HTTP status and says the outcome beside it."""
    stub = make_stub()
    stub.mode = "die" if mode == "stream_dies" else "normal"
    exporter = InMemorySpanExporter()
    config = GatewayConfig(model_name=MODEL, tiers=[TierEndpoint(name="fp16", base_url=stub.url)])
    gateway = start_server(create_app(config, span_exporter=exporter))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    with httpx.Client(timeout=30) as client:
        if mode == "whole":
            assert client.post(f"{gateway}/v1/chat/completions", json=body).status_code == 200
        else:
            with client.stream(
                "POST", f"{gateway}/v1/chat/completions", json={**body, "stream": True}
            ) as answer:
                assert answer.status_code == 200
                answer.read()
    wait_until(lambda: any(s.kind == SpanKind.SERVER for s in exporter.get_finished_spans()), 10)
    spans = exporter.get_finished_spans()
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
    assert server.name == "POST /v1/chat/completions"
    assert not [s for s in spans if s.name == "gateway.request"]
    attributes = dict(server.attributes or {})
    assert attributes["gateway.route.tier"] == "fp16"
    assert attributes["gateway.route.class"] in {"tolerant", "code", "math"}
    assert attributes["http.response.status_code"] == 200
    outcome = 502 if mode == "stream_dies" else 200
    assert attributes["gateway.response.status_code"] == outcome
    (upstream,) = [s for s in spans if s.name == "upstream"]
    assert upstream.parent is not None and upstream.parent.span_id == server.context.span_id
