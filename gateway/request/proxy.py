"""OpenAI API endpoints: read the request, plan it, relay the chosen tier's answer.

A completion request goes: body (size-limited, JSON object, served model) → ``assess``
(tokens, class) → ``plan_route`` (tiers and ``max_tokens``; gateway/request/plan.py) → the chain of
tiers (gateway/request/relay.py), inside a ``gateway.request`` span with ``classify``, ``route`` and
``upstream`` children. Every answer carries ``x-route-class``, ``x-route-tier`` and
``x-route-reason``; errors keep OpenAI's shape.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from backends.tier_state import TierState
from gateway.control.shadow import ShadowJob
from gateway.errors import SERVER_ERROR, APIError
from gateway.request.exchange import Exchange, usage_tokens
from gateway.request.plan import assess, plan_route, route_headers
from gateway.request.relay import (
    UpstreamStreamingResponse,
    open_chain,
    unless_client_leaves,
    whole_response,
)
from gateway.request.upstream import aclose_quietly
from gateway.runtime import Runtime, get_runtime
from gateway.telemetry import ATTR_CLASS, ATTR_INPUT_TOKENS, ATTR_REASON, inject_trace_headers

logger = logging.getLogger(__name__)

TIER_HEADER = "x-route-tier"
__all__ = ["UpstreamStreamingResponse", "check_model", "parse_json_object", "wants_stream"]


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, or 413 as soon as it is known to exceed ``max_bytes``."""
    too_large = APIError(413, f"request body exceeds {max_bytes} bytes", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_bytes:
                raise too_large
    except ClientDisconnect as exc:
        raise APIError(400, "client disconnected while sending the request body") from exc
    return bytes(body)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Decode a JSON object body; anything else is a one-line 400."""
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise APIError(
            400,
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
        ) from exc
    except ValueError as exc:  # e.g. bytes that are not UTF-8/16/32
        raise APIError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def check_model(body: dict[str, Any], model_name: str) -> dict[str, Any]:
    """Require ``model`` to be the served model (missing means it); returns the body to send."""
    model = body.get("model")
    if model is None:
        return {**body, "model": model_name}
    if not isinstance(model, str):
        raise APIError(400, "'model' must be a string", param="model", code="invalid_type")
    if model != model_name:
        raise APIError(
            404,
            f"The model '{_one_line(model)}' does not exist; this gateway serves '{model_name}'",
            param="model",
            code="model_not_found",
        )
    return body


def _one_line(text: str, limit: int = 100) -> str:
    """``text`` for an error message: escaped (no newline) and bounded."""
    shown = json.dumps(text, ensure_ascii=False)[1:-1]
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def wants_stream(body: Mapping[str, Any]) -> bool:
    """True when the client asked for server-sent events."""
    return body.get("stream") is True


async def _relay_completion(request: Request, path: str) -> Response:
    runtime = get_runtime(request)
    if not runtime.admission.enter():
        runtime.metrics.reject("overloaded")
        limit = runtime.admission.limit
        raise APIError(
            503,
            f"the gateway holds its limit of {limit} requests; retry shortly",
            SERVER_ERROR,
            code="overloaded",
            headers={"Retry-After": "1"},
        )
    exchange = Exchange(
        runtime.tracer,
        runtime.metrics,
        runtime.shared,
        path,
        on_finish=runtime.admission.leave,
    )
    async with exchange:  # leaving it finishes the exchange, unless a stream now owns it
        with trace.use_span(exchange.span, end_on_exit=False):
            answer, shadow = await _completion(request, path, runtime, exchange)
    if shadow is not None:  # once the exchange is finished (a whole answer) or owned by its stream
        offer_shadow(runtime, shadow)
    return answer


async def _completion(
    request: Request, path: str, runtime: Runtime, exchange: Exchange
) -> tuple[Response, ShadowJob | None]:
    """The answer, and the job to offer to shadow sampling when a tier answered 200."""
    config, tracer = runtime.config, runtime.tracer
    body = check_model(
        parse_json_object(await read_body(request, config.max_body_bytes)), config.model_name
    )
    active = runtime.policies.active
    with tracer.start_as_current_span("classify") as span:
        found = assess(body, path, active.policy, active.rules, runtime.counter)
        span.set_attributes(
            {
                ATTR_CLASS: found.cls,
                ATTR_REASON: found.reason,
                ATTR_INPUT_TOKENS: found.input_tokens,
            }
        )
        if found.p_precise is not None:
            span.set_attribute("gateway.route.p_precise", found.p_precise)
    exchange.cls, exchange.reason, exchange.input_tokens = (
        found.cls,
        found.reason,
        found.input_tokens,
    )
    pinned = request.headers.get(active.policy.pinning.header)
    with tracer.start_as_current_span("route") as span:
        plan = plan_route(found, active.policy, runtime.board.statuses(), pinned, path)
        span.set_attribute(ATTR_REASON, plan.reason)
    exchange.reason = plan.reason
    tiers = [runtime.board.tiers[name] for name in plan.chain]

    upstream_span = exchange.child("upstream")
    headers = dict(request.headers)
    inject_trace_headers(headers, trace.set_span_in_context(upstream_span))

    async def exchange_with_tiers() -> tuple[Response, ShadowJob | None]:
        try:
            tier, response = await open_chain(
                runtime.upstream,
                tiers,
                lambda name: plan.body_for(name, body),
                path,
                headers,
                exchange,
                active.policy.timeouts.first_byte_seconds,
            )
        except APIError as exc:
            exc.headers.update(route_headers(plan.cls, None, plan.reason))
            raise
        upstream_span.set_attribute("gateway.route.tier", tier.name)
        answer_headers = route_headers(plan.cls, tier.name, plan.reason)
        link = exchange.span.get_span_context()  # shadow comparisons link to the request
        shadow = ShadowJob(
            tier.name, path, plan.body_for(tier.name, body), plan.max_tokens_field, None, link
        )
        if wants_stream(body) and response.status_code == 200:
            # From here on the streaming response owns the upstream and finishes the exchange;
            # its shadow job (no answer) is counted as dropped (streaming) when drawn.
            stream = UpstreamStreamingResponse(
                runtime.upstream, tier, response, answer_headers, exchange
            )
            return stream, shadow
        raw = await runtime.upstream.read(tier, response)
        prompt_tokens, exchange.output_tokens = usage_tokens(raw)
        exchange.input_tokens = prompt_tokens or exchange.input_tokens
        answer = whole_response(tier, response, raw, answer_headers)
        exchange.set_outcome(answer.status_code)
        if response.status_code == 200:
            return answer, dataclasses.replace(shadow, answer=raw)
        return answer, None

    outcome = await unless_client_leaves(request, exchange_with_tiers)
    if outcome is None:
        logger.info("client left %s before the answer; upstream request closed", path)
        exchange.set_outcome(499)
        return Response(status_code=499), None  # nobody is listening any more
    return outcome


def offer_shadow(runtime: Runtime, job: ShadowJob) -> None:
    """Offer an answered request to shadow sampling (gateway/control/shadow.py); never waits."""
    policy = runtime.policies.active.policy.shadow
    runtime.shadow.offer(policy, job, runtime.admission.current, runtime.admission.limit)


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    return await _relay_completion(request, "/v1/chat/completions")


async def completions(request: Request) -> Response:
    """``POST /v1/completions``."""
    return await _relay_completion(request, "/v1/completions")


async def list_models(request: Request) -> Response:
    """``GET /v1/models``: the served model's entry, from the first ready tier that answers."""
    runtime = get_runtime(request)
    model_name = runtime.config.model_name
    ready = [s.name for s in runtime.board.statuses().values() if s.state == TierState.READY]
    failures: list[str] = []
    for name in ready:
        tier = runtime.board.tiers[name]
        try:
            response = await runtime.upstream.send(tier, "GET", "/v1/models", None, request.headers)
        except APIError as exc:
            failures.append(f"{name}: {exc.code}")
            continue
        raw = await runtime.upstream.read(tier, response)
        if response.status_code != 200:
            await aclose_quietly(response)
            failures.append(f"{name}: HTTP {response.status_code}")
            continue
        return _models_answer(name, raw, model_name)
    raise APIError(
        503,
        f"no tier is available ({', '.join(failures) or 'none is ready'}); retry shortly",
        SERVER_ERROR,
        code="no_tier_available",
        headers={"Retry-After": "5"},
    )


def _models_answer(tier: str, raw: bytes, model_name: str) -> Response:
    try:
        payload = json.loads(raw)
        listed = [entry for entry in payload["data"] if isinstance(entry, dict)]
    except (ValueError, KeyError, TypeError) as exc:
        raise APIError(
            502,
            f"tier '{tier}' sent a malformed /v1/models answer",
            SERVER_ERROR,
            code="upstream_error",
        ) from exc
    served = [entry for entry in listed if entry.get("id") == model_name]
    if not served:
        ids = ", ".join(str(entry.get("id")) for entry in listed) or "nothing"
        raise APIError(
            502,
            f"tier '{tier}' does not serve model '{model_name}' (it lists {ids})",
            SERVER_ERROR,
            code="model_mismatch",
        )
    return JSONResponse({"object": "list", "data": served}, headers={TIER_HEADER: tier})
