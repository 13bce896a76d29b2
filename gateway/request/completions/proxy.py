"""OpenAI API endpoints: read the request, plan it, relay the chosen tier's answer.

A completion request goes: body (size-limited, read within ``body_timeout``, JSON object, served
model; all before the request takes one of the ``max_in_flight`` slots) → ``assess``
(tokens, class) → ``plan_route`` (tiers and ``max_tokens``; gateway/request/route/plan.py) → the
request value every later step reads (gateway/request/route/decided.py) → the chain of tiers
(gateway/request/route/chain.py), its answer relayed (gateway/request/stream/relay.py,
gateway/request/completions/whole.py); the phases are ``_completion``'s functions. Class, reason and
tokens are attributes of the request's server span (gateway/request/exchange.py), with an
``upstream`` child. Every answer carries ``x-route-class``, ``x-route-tier`` and
``x-route-reason``; errors keep OpenAI's shape.
"""

from __future__ import annotations

import dataclasses
import logging
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.trace import Span
from starlette.requests import Request
from starlette.responses import Response

from gateway.auth import KEY_DIGEST, KEY_ID
from gateway.control.live_guard import GuardSettings, per_who_cap
from gateway.control.shadow import ShadowJob
from gateway.errors import DETAIL, FULL_DETAIL, SERVER_ERROR, APIError, full_detail
from gateway.policy.schema import RoutingPolicy
from gateway.policy.store import ActivePolicy
from gateway.request.completions.body import check_model, parse_json_object, read_body, wants_stream
from gateway.request.completions.fields import screen_fields
from gateway.request.completions.tier_body import tier_body
from gateway.request.completions.whole import assembled_answer
from gateway.request.events.answer_usage import MalformedAnswer, answer_usage
from gateway.request.exchange import Exchange
from gateway.request.kind import Kind
from gateway.request.route.chain import open_chain
from gateway.request.route.decided import CompletionRequest
from gateway.request.route.endpoint_choice import Saturation, endpoint_id, session_key
from gateway.request.route.plan import Assessment, assess, plan_route, route_headers, settle_band
from gateway.request.stream.relay import (
    Reply,
    UpstreamStreamingResponse,
    unless_client_leaves,
    whole_response,
)
from gateway.request.stream.resume import stream_resumer, use_tier_count
from gateway.request.tokens.prompt_count import count_prompt
from gateway.request.upstream.client import Opened, UpstreamFailed
from gateway.runtime import Runtime, get_runtime
from gateway.telemetry import inject_trace_headers

logger = logging.getLogger(__name__)

TIER_HEADER = "x-route-tier"
ENDPOINT_HEADER = "x-route-endpoint"  # which endpoint of the tier's pool answered
ATTR_ENDPOINT = "gateway.route.endpoint"


def note_detail(request: Request, runtime: Runtime) -> bool:
    """Whether this request's client is told everything (the policy's ``errors.detail``, or an
    admin key; gateway/errors.py), noted in the request's state for the error handler."""
    if runtime.policies.active.policy.errors.detail == FULL_DETAIL:
        request.scope.setdefault("state", {})[DETAIL] = FULL_DETAIL
    return full_detail(request)


async def _relay_completion(request: Request, kind: Kind) -> Response:
    runtime = get_runtime(request)
    config = runtime.config
    note_detail(request, runtime)
    # The server span (gateway/server_span.py) is current: the exchange annotates it rather
    # than starting a span of its own (a span is ~4 % of the instructions of a proxied request).
    server_span = trace.get_current_span()
    exchange = Exchange(
        runtime.tracer,
        runtime.metrics,
        runtime.shared,
        kind.path,
        log=runtime.request_log,
        span=server_span if server_span.get_span_context().is_valid else None,
        observer=runtime.live.observe,
    )
    async with exchange:  # leaving it finishes the exchange, unless a stream now owns it
        with _current(exchange):
            # The whole body first: a client sending it slowly holds no in-flight slot.
            raw = await read_body(request, config.max_body_bytes, config.body_timeout)
            body = check_model(parse_json_object(raw, config.max_body_values), config.model_name)
            policy = runtime.policies.active.policy
            key_digest = request.scope.get("state", {}).get(KEY_DIGEST)
            screen_fields(body, kind, policy.fields, policy.limits, key_digest)
            if not runtime.admission.enter():
                limit = runtime.admission.limit
                raise APIError(
                    503,
                    f"the gateway holds its limit of {limit} requests; retry shortly",
                    SERVER_ERROR,
                    code="overloaded",
                    headers={"Retry-After": "1"},
                    public="the gateway is at capacity; retry shortly",
                )
            exchange.on_finish = runtime.admission.leave
            received = Received(request, body, kind, runtime, exchange)
            answer, shadow = await _completion(received)
    if shadow is not None:  # once the exchange is finished (a whole answer) or owned by its stream
        offer_shadow(runtime, shadow)
    return answer


class Received(NamedTuple):
    """What every phase of a completion reads: the HTTP request, its body (parsed, screened),
    its kind, the runtime and the request's exchange."""

    request: Request
    body: dict[str, Any]
    kind: Kind
    runtime: Runtime
    exchange: Exchange


async def _completion(received: Received) -> tuple[Response, ShadowJob | None]:
    """The answer, and the job to offer to shadow sampling when a tier answered 200: the
    request assessed, decided into one value, then answered by the first tier of its chain
    that takes it (or 499 when the client leaves first)."""
    request, runtime, exchange = received.request, received.runtime, received.exchange
    active = runtime.policies.active  # one policy for the whole request
    found = await _assess(received, active)
    decided, upstream_span = _decide(received, found, active.policy)
    answer = partial(_answer, runtime, decided, exchange, upstream_span)
    outcome = await unless_client_leaves(request, answer)
    if outcome is None:
        logger.info("client left %s before the answer; upstream request closed", received.kind.path)
        exchange.set_outcome(499)
        return Response(status_code=499), None  # nobody is listening any more
    return outcome


async def _assess(received: Received, active: ActivePolicy) -> Assessment:
    """Count and classify the prompt (gateway/request/route/plan.py ``assess``), noted on the
    exchange; the rate limit is charged the rest of what the request costs."""
    request, body, kind, runtime, exchange = received
    # Classifying and planning are pure computation: span attributes, not spans of their own.
    contexts = [(tier.name, tier.max_model_len) for tier in runtime.config.tiers]
    longest = max(length for _, length in contexts)
    found = assess(body, kind, active.policy, active.rules, runtime.counter,
                   context_limit=longest, tiers=contexts)  # fmt: skip
    if found.band is not None:  # the first stage was unsure: the second decides, off the loop
        found = await settle_band(found)
    exchange.cls, exchange.reason = found.cls, found.reason
    exchange.input_tokens = found.input_tokens
    if not found.counted:  # planned on a bound: the exact count once the answer is out
        exchange.count_input = partial(count_prompt, body, kind, runtime.counter, longest - 1)
    exchange.p_precise = found.p_precise
    # The rate limit took one unit at the door (gateway/auth.py): the rest of what it costs.
    charge = getattr(request.state, "rate_charge", None)
    if charge is not None and found.cost > 1:
        await charge(found.cost - 1)
    return found


def _decide(
    received: Received, found: Assessment, policy: RoutingPolicy
) -> tuple[CompletionRequest, Span]:
    """The request decided (gateway/request/route/decided.py): its plan and chain of
    endpoints, how its tiers are asked; and the ``upstream`` span whose context they are sent."""
    request, body, kind, runtime, exchange = received
    full = full_detail(request)
    pinned = request.headers.get(policy.pinning.header)
    limits = saturation_limits(policy)
    plan = plan_route(found, policy, runtime.board.statuses(limits), pinned, kind)
    exchange.reason = plan.reason
    session = session_key(request.headers, body)
    chain = [runtime.board.endpoint_chain(name, session, limits) for name in plan.chain]

    upstream_span = exchange.child("upstream")
    headers = dict(request.headers)
    inject_trace_headers(headers, trace.set_span_in_context(upstream_span))
    sent, assembling, usage_asked = tier_body(body, kind, policy.failover.assembles)
    # A stream's headers come once the tier has scheduled it (time in its queue, then the
    # prompt's prefill): giving up on a silent tier is safe. A whole answer's come when it is
    # complete: giving up would generate it again on the next tier, so read_timeout bounds it.
    streamed = wants_stream(sent)  # the tier is asked for a stream
    first_byte = policy.timeouts.first_byte_seconds if streamed else float("inf")
    decided = CompletionRequest(
        kind, body, plan, chain, headers, sent, streamed, first_byte, assembling, usage_asked,
        full, asker(request), runtime.config.model_name, runtime.counter, policy.escalation,
    )  # fmt: skip
    return decided, upstream_span


async def _answer(
    runtime: Runtime, decided: CompletionRequest, exchange: Exchange, upstream_span: Span
) -> tuple[Response, ShadowJob | None]:
    """Open the chain, then answer: a stream, a whole answer assembled from one, or a whole
    answer; with the job for shadow sampling."""
    opened, reply = await _open(runtime, decided, exchange, upstream_span)
    link = exchange.span.get_span_context()  # shadow comparisons link to the request
    plan, tier = decided.plan, opened.tier
    body = plan.body_for(tier.name, decided.body)
    shadow = ShadowJob(tier.name, decided.kind.path, body, plan.max_tokens_field, None, link,
                       plan.cls)  # fmt: skip
    if decided.streamed and opened.response.status_code == 200:
        return await _stream(runtime, decided, opened, reply, shadow)
    return await _whole(opened, reply, shadow)


async def _open(
    runtime: Runtime, decided: CompletionRequest, exchange: Exchange, upstream_span: Span
) -> tuple[Opened, Reply]:
    """The first endpoint of the chain that answers (gateway/request/route/chain.py), and how the
    client is answered: the ``x-route-*`` headers (on a failure to open too)."""
    plan, full = decided.plan, decided.full
    try:
        tier, response = await open_chain(runtime.upstream, decided.chain, decided, exchange)
    except APIError as exc:
        exc.headers.update(route_headers(plan.cls, None, plan.reason))
        raise
    upstream_span.set_attribute("gateway.route.tier", tier.name)
    upstream_span.set_attribute(ATTR_ENDPOINT, tier.base_url)
    headers = route_headers(plan.cls, tier.name, plan.reason if full else None)
    # Addresses only to clients told everything; others get the endpoint's stable id
    # (/admin/tiers lists both).
    headers[ENDPOINT_HEADER] = tier.base_url if full else endpoint_id(tier.base_url)
    return Opened(runtime.upstream, tier, response), Reply(headers, exchange, full)


async def _stream(
    runtime: Runtime, decided: CompletionRequest, opened: Opened, reply: Reply, shadow: ShadowJob
) -> tuple[Response, ShadowJob | None]:
    """A tier's stream: relayed (continued on the next tier when it fails midway and can be),
    or assembled into the whole answer the client asked."""
    on_watched = partial(guard_escalations, runtime, decided.cls, decided.who)
    resumer = stream_resumer(opened.upstream, decided, reply.exchange, on_watched)
    if decided.assembling:  # a whole answer: one tier's alone is offered to shadow sampling
        raw, answer = await assembled_answer(opened, resumer, reply, decided.kind)
        return answer, dataclasses.replace(shadow, answer=raw) if raw else None
    # From here on the streaming response owns the upstream and finishes the exchange; its
    # shadow job (no answer) is counted as dropped (streaming) when drawn.
    return UpstreamStreamingResponse(opened, reply, resumer, decided.usage_asked), shadow


async def _whole(
    opened: Opened, reply: Reply, shadow: ShadowJob
) -> tuple[Response, ShadowJob | None]:
    """A tier's whole answer, read and relayed (its usage read for the counts)."""
    tier, response, exchange = opened.tier, opened.response, reply.exchange
    try:
        raw = await opened.upstream.read(tier, response)
        prompt_tokens, exchange.output_tokens = (
            answer_usage(raw) if response.status_code == 200 else (None, None)
        )
    except MalformedAnswer as exc:
        failed = UpstreamFailed(tier.name, f"its answer is malformed: {exc}")
        logger.warning("%s", failed.message)
        failed.headers.update(reply.headers)
        raise failed from exc
    except APIError as exc:
        exc.headers.update(reply.headers)
        raise
    use_tier_count(exchange, prompt_tokens, None)
    exchange.set_outcome(response.status_code)
    answer = whole_response(tier, response, raw, reply)
    if response.status_code == 200:
        return answer, dataclasses.replace(shadow, answer=raw)
    return answer, None


def _current(exchange: Exchange) -> AbstractContextManager[object]:
    """The exchange's span as the current one (already so when it is the server span)."""
    if exchange.owns_span:
        return trace.use_span(exchange.span, end_on_exit=False)
    return nullcontext()


def guard_escalations(
    runtime: Runtime, cls: str, who: str | None, tier: str, degenerated: bool
) -> None:
    """Feed a watched stream's outcome, asked by ``who``, to the live guard (the policy's
    ``escalation.guard``; gateway/control/live_guard.py); a tier it withholds from a class is
    logged and counted."""
    guard = runtime.policies.active.policy.escalation.guard
    if guard.max_rate is None:
        return
    per_who = per_who_cap(guard.max_rate, guard.min_samples) if guard.per_key else None
    floors = {cls: 1 - guard.max_rate}
    settings = GuardSettings(guard.window, guard.min_samples, floors, per_who)
    outcome = 0.0 if degenerated else 1.0
    if not runtime.board.guard.record(settings, tier, cls, outcome, "escalation", who):
        return
    rate = 1 - runtime.board.guard.mean(tier, cls, "escalation")
    samples = runtime.board.guard.samples(tier, cls, "escalation")
    logger.warning(
        "live guard: tier %s withheld from class %s (%.0f%% of its last %d watched streams "
        "escalated > %.0f%%); restore it after a fresh check: POST /admin/tiers/%s/restore",
        tier, cls, rate * 100, samples, guard.max_rate * 100, tier,
    )  # fmt: skip
    runtime.metrics.guard_trip(tier, cls)


def asker(request: Request) -> str | None:
    """Who asked, as the live guard counts askers: the API key the middleware matched
    (gateway/auth.py: a digest prefix), else the client's address."""
    key = request.scope.get("state", {}).get(KEY_ID)
    if key is not None:
        return f"key:{key}"
    client = request.scope.get("client")
    return f"addr:{client[0]}" if client else None


def saturation_limits(policy: RoutingPolicy) -> Saturation:
    """The policy's saturation thresholds, as the endpoint choice takes them."""
    return Saturation(policy.saturation.max_requests_waiting, policy.saturation.max_kv_usage)


def offer_shadow(runtime: Runtime, job: ShadowJob) -> None:
    """Offer an answered request to shadow sampling (gateway/control/shadow.py); never waits
    and never raises: a sample that cannot start (its task group closed at shutdown, say)
    must not cost the client an answer the tier already gave, nor leave its exchange open."""
    policy = runtime.policies.active.policy.shadow
    try:
        runtime.shadow.offer(policy, job, runtime.admission.current, runtime.admission.limit)
    except Exception:
        logger.exception("shadow sampling could not take a %s answer; it is dropped", job.tier)


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    return await _relay_completion(request, Kind.CHAT)


async def completions(request: Request) -> Response:
    """``POST /v1/completions``."""
    return await _relay_completion(request, Kind.COMPLETIONS)
