"""Shadow sampling: compare a cheaper tier's answer with the reference tier's, off the path.

After a client's request to one of ``shadow.tiers`` (int4, int8) has been answered, it is
drawn with probability ``shadow.fraction``; a drawn request is compared with the reference
tier (fp16) in a background task the client never waits for, or dropped (counted by reason).

Pure parts:
- ``decide``: skip (not a shadowed tier, not drawn), compare, or the first drop reason of:
  ``streaming`` (only whole answers are shadowed: the relayed stream is not kept),
  ``slots_full`` (``max_concurrent`` comparisons run), ``overloaded`` (the gateway holds more
  than ``max_gateway_load`` of its ``max_in_flight``), ``reference_not_ready``,
  ``reference_busy`` (requests wait in its queue), ``tier_not_ready``. Later, ``no_text``
  (an answer without text), ``failed`` (a shadow request's error) and ``timeout``.
- Deterministic comparison: a greedy request (``temperature`` 0) keeps the client's answer and
  sends the reference one greedy copy; any other request sends greedy copies to both the
  served tier and the reference. Copies are whole (not streamed), ``n`` 1, at most
  ``shadow.max_tokens`` tokens, the client's other parameters unchanged.
- ``agreement``: both texts are tokenized with the gateway's tokenizer (no special tokens; UTF-8
  bytes without one) and cut to ``max_tokens`` tokens; agreement = tokens of their common prefix
  / tokens of the longer one (1.0 for two empty answers). So 1.0 means identical outputs and
  a first divergence at position k of n gives k/n. A comparison deviates when its agreement
  is below ``deviation_threshold``.

I/O part: ``ShadowSampler`` runs the comparisons in the lifespan's task group, at most
``max_concurrent`` at once, through the gateway's ``Upstream`` (the shared httpx client) but
outside the client's accounting: no exchange, no in-flight slot, no request metrics. Each is a
``gateway.shadow`` span of its own trace, linked to the client's request span.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, Tracer

from backends.tier_state import TierState
from gateway.control.live_guard import GuardSettings
from gateway.control.tier_status import TierBoard
from gateway.errors import APIError
from gateway.metrics import GatewayMetrics
from gateway.policy.schema import ShadowPolicy
from gateway.request.route.endpoint_choice import Saturation
from gateway.request.tokens.limits import TokenCounter
from gateway.request.tokens.prompt_count import PromptCounter
from gateway.request.upstream.client import Upstream
from gateway.telemetry import ATTR_TIER, inject_trace_headers

logger = logging.getLogger(__name__)

_ANY_LOAD = Saturation(float("inf"), float("inf"))  # order a pool's endpoints, drop none
SKIP = "skip"  # not a shadowed tier, or not drawn: nothing is counted
COMPARE = "compare"
Encode = Callable[[str], Sequence[int]]


@dataclass(frozen=True)
class Load:
    """What a shadow decision looks at, besides the policy and the draw."""

    running: int  # comparisons running now
    gateway_in_flight: int  # client requests this process holds
    gateway_limit: int  # its max_in_flight
    reference_state: TierState | None  # None: the board has no such tier
    reference_waiting: float  # the reference tier's scraped vllm:num_requests_waiting
    tier_state: TierState | None  # the served tier's (its greedy copy, for a non-greedy request)


def decide(
    policy: ShadowPolicy, tier: str, draw: float, streaming: bool, greedy: bool, load: Load
) -> str:
    """``SKIP``, ``COMPARE`` or a drop reason; ``draw`` is uniform in [0, 1)."""
    if tier not in policy.tiers or tier == policy.reference or draw >= policy.fraction:
        return SKIP
    if streaming:
        return "streaming"
    # The gateway's own bounds first, then the tiers' states.
    if load.running >= policy.max_concurrent:
        return "slots_full"
    if load.gateway_in_flight > policy.max_gateway_load * load.gateway_limit:
        return "overloaded"
    if load.reference_state != TierState.READY:
        return "reference_not_ready"
    if load.reference_waiting > 0:
        return "reference_busy"
    if not greedy and load.tier_state != TierState.READY:
        return "tier_not_ready"
    return COMPARE


def is_greedy(body: Mapping[str, Any]) -> bool:
    """The request asked for greedy decoding (``temperature`` 0); absent means the tier's
    default, which need not be greedy."""
    temperature = body.get("temperature")
    return (
        isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
        and (temperature == 0)
    )


def shadow_body(body: Mapping[str, Any], max_tokens_field: str, cap: int) -> dict[str, Any]:
    """A greedy, whole, single-choice copy of ``body`` with at most ``cap`` new tokens."""
    copy = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    asked = body.get(max_tokens_field)
    limit = min(asked, cap) if isinstance(asked, int) and asked > 0 else cap
    return {**copy, "temperature": 0, "n": 1, max_tokens_field: limit}


def answer_text(raw: bytes) -> str | None:
    """The first choice's text of a whole chat or completions answer (``None``: none)."""
    try:
        choice = json.loads(raw)["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(choice, dict):
        return None
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return text if isinstance(text, str) else None


def agreement(served: Sequence[int], reference: Sequence[int]) -> float:
    """Common-prefix tokens / tokens of the longer sequence; 1.0 when both are empty."""
    longer = max(len(served), len(reference))
    if longer == 0:
        return 1.0
    common = 0
    for a, b in zip(served, reference, strict=False):
        if a != b:
            break
        common += 1
    return common / longer


def text_agreement(served: str, reference: str, encode: Encode, cap: int) -> float:
    """``agreement`` of two texts tokenized by ``encode`` and cut to ``cap`` tokens."""
    return agreement(list(encode(served))[:cap], list(encode(reference))[:cap])


def encoder(counter: PromptCounter) -> Encode:
    """The gateway's tokenizer as an encoder (without one: UTF-8 bytes)."""
    if isinstance(counter, TokenCounter):
        tokenizer = counter.tokenizer
        return lambda text: tokenizer.encode(text, add_special_tokens=False).ids
    return lambda text: list(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class ShadowJob:
    """One answered client request that may be compared."""

    tier: str  # the tier that answered
    path: str
    body: Mapping[str, Any]  # as sent to that tier
    max_tokens_field: str
    answer: bytes | None  # the client's whole answer; None for a stream
    link: SpanContext  # the client's request span
    cls: str = ""  # the request's class (the live guard keeps one window per tier and class)


class ShadowFailed(Exception):
    """A shadow request did not give a usable answer; ``reason`` is the drop reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ShadowSampler:
    """Draws, then runs or drops comparisons in the background (see the module docstring)."""

    def __init__(
        self,
        upstream: Upstream,
        board: TierBoard,
        metrics: GatewayMetrics,
        tracer: Tracer,
        encode: Encode,
        rng: random.Random | None = None,
    ) -> None:
        self._upstream, self._board, self._metrics = upstream, board, metrics
        self._tracer, self._encode = tracer, encode
        self._rng = rng or random.Random()
        self._group: TaskGroup | None = None
        self.running = 0

    def attach(self, group: TaskGroup | None) -> None:
        """Run comparisons in ``group`` (the lifespan's); ``None``: stop taking new ones."""
        self._group = group

    def offer(self, policy: ShadowPolicy, job: ShadowJob, in_flight: int, limit: int) -> str:
        """Decide about ``job`` now and start its comparison if so; never waits."""
        if job.tier not in policy.tiers or policy.fraction <= 0:
            return SKIP
        statuses = self._board.statuses()
        reference, served = statuses.get(policy.reference), statuses.get(job.tier)
        greedy = is_greedy(job.body)
        load = Load(
            running=self.running,
            gateway_in_flight=in_flight,
            gateway_limit=limit,
            reference_state=reference.state if reference else None,
            reference_waiting=reference.requests_waiting if reference else 0.0,
            tier_state=served.state if served else None,
        )
        streaming = job.answer is None
        decision = decide(policy, job.tier, self._rng.random(), streaming, greedy, load)
        if decision == COMPARE and self._group is None:
            decision = "not_running"
        if decision == COMPARE and self._group is not None:
            self._set_running(+1)
            self._group.start_soon(self._compare, policy, job, greedy)
        elif decision != SKIP:
            self._metrics.shadow_drop(job.tier, decision)
        return decision

    def _set_running(self, step: int) -> None:
        self.running += step
        self._metrics.shadow_in_flight.set(self.running)

    async def _compare(self, policy: ShadowPolicy, job: ShadowJob, greedy: bool) -> None:
        attributes = {ATTR_TIER: job.tier, "gateway.shadow.reference": policy.reference}
        span = self._tracer.start_span(
            "gateway.shadow",
            context=otel_context.Context(),  # its own trace, linked to the client's request
            links=[Link(job.link)],
            attributes=attributes,
        )
        try:
            with trace.use_span(span, end_on_exit=False), anyio.fail_after(policy.timeout_seconds):
                served, reference = await self._answers(policy, job, greedy, span)
            score = text_agreement(served, reference, self._encode, policy.max_tokens)
            deviated = score < policy.deviation_threshold
            self._metrics.shadow_compared(job.tier, score, deviated)
            self._guard(policy, job, score)
            span.set_attributes(
                {"gateway.shadow.agreement": score, "gateway.shadow.greedy": greedy}
            )
        except ShadowFailed as exc:
            self._drop(job.tier, exc.reason, span)
        except TimeoutError:
            self._drop(job.tier, "timeout", span)
        except Exception:  # never let a comparison break the lifespan's task group
            logger.exception("shadow comparison of %s failed", job.tier)
            self._drop(job.tier, "failed", span)
        finally:
            span.end()
            self._set_running(-1)

    def _guard(self, policy: ShadowPolicy, job: ShadowJob, score: float) -> None:
        """Feed the live guard; a tier it withholds from a class is logged and counted."""
        guard = policy.guard
        settings = GuardSettings(guard.window, guard.min_samples, guard.floors)
        if not job.cls or not self._board.guard.record(settings, job.tier, job.cls, score):
            return
        mean = self._board.guard.mean(job.tier, job.cls)
        logger.warning(
            "live guard: tier %s withheld from class %s (mean shadow agreement %.3f over %d "
            "comparisons < floor %.2f); restore it after a fresh check: POST "
            "/admin/tiers/%s/restore",
            job.tier,
            job.cls,
            mean,
            self._board.guard.samples(job.tier, job.cls),
            guard.floors[job.cls],
            job.tier,
        )
        self._metrics.guard_trip(job.tier, job.cls)

    def _drop(self, tier: str, reason: str, span: trace.Span) -> None:
        self._metrics.shadow_drop(tier, reason)
        span.set_attribute("gateway.shadow.dropped", reason)

    async def _answers(
        self, policy: ShadowPolicy, job: ShadowJob, greedy: bool, span: trace.Span
    ) -> tuple[str, str]:
        body = shadow_body(job.body, job.max_tokens_field, policy.max_tokens)
        headers = {"content-type": "application/json"}
        inject_trace_headers(headers, trace.set_span_in_context(span))
        if greedy:
            kept = answer_text(job.answer or b"")
            if kept is None:
                raise ShadowFailed("no_text")
            return kept, await self._ask(policy.reference, job.path, body, headers)
        found: dict[str, str | ShadowFailed] = {}

        async def ask(name: str) -> None:
            try:
                found[name] = await self._ask(name, job.path, body, headers)
            except ShadowFailed as exc:  # kept: a task group would wrap it in a group
                found[name] = exc

        async with anyio.create_task_group() as group:
            group.start_soon(ask, job.tier)
            group.start_soon(ask, policy.reference)
        served, reference = found[job.tier], found[policy.reference]
        for answer in (served, reference):
            if isinstance(answer, ShadowFailed):
                raise answer
        assert isinstance(served, str) and isinstance(reference, str)
        return served, reference

    async def _ask(
        self, name: str, path: str, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> str:
        # The least loaded ready endpoint of the tier's pool (saturation is decide()'s to judge).
        known = name in self._board.tiers
        chain = self._board.endpoint_chain(name, None, _ANY_LOAD) if known else []
        if not chain:
            raise ShadowFailed("reference_not_ready")
        tier = chain[0]
        try:
            response = await self._upstream.send(tier, "POST", path, dict(body), headers)
            raw = await self._upstream.read(tier, response)
        except APIError as exc:
            raise ShadowFailed("failed") from exc
        if response.status_code != 200:
            raise ShadowFailed("failed")
        text = answer_text(raw)
        if text is None:
            raise ShadowFailed("no_text")
        return text
