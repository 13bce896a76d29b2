"""One OpenTelemetry server span per HTTP request, as pure ASGI middleware.

What OpenTelemetry's ASGI instrumentation does for the gateway, at a fraction of its cost
(it decodes every header, builds two attribute sets and checks each message; ~150 µs of CPU a
request here, this ~25 µs: ``docs/benchmarks.md``). The contract, tested in
tests/unit/gateway/test_gateway_telemetry.py:

- the span joins an incoming ``traceparent`` (OpenTelemetry's global propagator: W3C trace
  context and baggage unless ``OTEL_PROPAGATORS`` says otherwise) and is current while the app
  runs, so the app's spans are its children;
- it is named ``"{method} {route}"`` for the app's routes (``/admin/tiers/{tier}/restore`` as
  written) and ``"{method}"`` for anything else (unbounded paths would make unbounded names);
- attributes: ``http.request.method``, ``url.path``, ``url.scheme``, ``http.route`` (when
  routed), ``client.address``, ``user_agent.original``, ``http.response.status_code``; a 5xx
  sets the span's status to error;
- messages pass through one by one (a streamed answer is not buffered); the span ends when
  the app returns, however it returns;
- ``untraced`` paths (``/metrics``, ``/healthz``) get no span at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, set_span_in_context
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_HEADERS = {b"traceparent": "traceparent", b"tracestate": "tracestate", b"baggage": "baggage"}


def _pattern(route: str) -> re.Pattern[str]:
    """``/admin/tiers/{tier}/restore`` as a regex matching any one segment for ``{tier}``."""
    parts = ("[^/]+" if p.startswith("{") else re.escape(p) for p in route.split("/"))
    return re.compile("/".join(parts) + "$")


class ServerSpans:
    """Pure ASGI middleware: a server span around each HTTP request (see the module docstring)."""

    def __init__(
        self, app: ASGIApp, tracer: Tracer, routes: Iterable[str], untraced: Iterable[str]
    ) -> None:
        self.app, self.tracer = app, tracer
        self.untraced = frozenset(untraced)
        routes = list(routes)
        self.exact = frozenset(r for r in routes if "{" not in r)
        self.templates = [(_pattern(r), r) for r in routes if "{" in r]

    def route_of(self, path: str) -> str | None:
        if path in self.exact:
            return path
        return next((route for pattern, route in self.templates if pattern.match(path)), None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in self.untraced:
            await self.app(scope, receive, send)
            return
        carrier: dict[str, str] = {}
        user_agent = ""
        for name, value in scope.get("headers", ()):
            if name in _HEADERS:
                carrier[_HEADERS[name]] = value.decode("latin-1")
            elif name == b"user-agent":
                user_agent = value.decode("latin-1")
        method = scope.get("method", "")
        route = self.route_of(path)
        attributes: dict[str, str] = {
            "http.request.method": method,
            "url.path": path,
            "url.scheme": scope.get("scheme", "http"),
        }
        if route is not None:
            attributes["http.route"] = route
        client = scope.get("client")
        if client:
            attributes["client.address"] = client[0]
        if user_agent:
            attributes["user_agent.original"] = user_agent
        parent = propagate.extract(carrier) if carrier else None
        span = self.tracer.start_span(
            f"{method} {route}" if route else method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
        )

        async def send_with_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
            await send(message)

        token = otel_context.attach(set_span_in_context(span, parent))
        try:
            await self.app(scope, receive, send_with_status)
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            otel_context.detach(token)
            span.end()
