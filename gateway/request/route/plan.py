"""Plan one completion request: count → classify → check limits → choose tiers (pure).

``assess`` then ``plan_route`` turn a request body into a ``Plan``: its class and the
header-ready reason, its prompt tokens, and the chain of tiers to try, each with the
``max_tokens`` to send it (a clamped value, the client's own, or ``None`` to leave the body
alone). A request that cannot be served raises ``APIError`` in OpenAI's shape: 400 for the
client's mistakes (malformed messages, ``context_length_exceeded``, oversized ``max_tokens``
when the policy rejects), 503 with ``Retry-After`` when no tier can take it now. Nothing here
does I/O: the tier statuses come from gateway/control/tier_status.py and the policy from
gateway/policy/store.py.

Order of the checks (policies/routing.yaml explains each knob):
0. the fields that multiply its cost (n, best_of, list prompts, logprobs, tools, and stream's
   type) are checked against the policy's limits (gateway/request/tokens/costs.py);
1. the prompt is counted with the model's tokenizer (chat template applied), given a context
   limit only as far as it (a longer prompt is refused at once: bounded work per request);
2. the classifier names its class (gateway/request/classify/classes.py);
3. a prompt over ``limits.max_input_tokens`` is refused or re-classed ``long``;
4. the route of the class gives the tiers that are ready, unsaturated and long enough
   (gateway/request/route/router.py); a pin header replaces the route when the policy allows it;
5. each tier's ``max_tokens`` is checked against its ``max_model_len`` (clamped or refused).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import INVALID_REQUEST, SERVER_ERROR, APIError
from gateway.policy.schema import RoutingPolicy
from gateway.request.classify.classes import CompiledClasses, classify_request
from gateway.request.classify.second_stage import BandQuery, settle
from gateway.request.kind import Kind
from gateway.request.route.router import (
    CONTEXT_LENGTH_EXCEEDED,
    UNKNOWN_TIER,
    RouteDecision,
    RouteRequest,
    TierStatus,
    choose_tier,
)
from gateway.request.tokens.costs import count_field, request_cost
from gateway.request.tokens.limits import check_limits, check_prompt
from gateway.request.tokens.prompt_bound import bound_decides
from gateway.request.tokens.prompt_count import PromptCounter, bound_prompt, count_prompt

MAX_REASON = 400  # characters of x-route-reason


@dataclass(frozen=True)
class Plan:
    """Where a request goes and why."""

    cls: str
    reason: str  # one ASCII line: classification, route, limits
    input_tokens: int
    chain: tuple[str, ...]
    max_tokens: Mapping[str, int | None]  # per tier; None: send the body's own value
    max_tokens_field: str  # "max_tokens" or "max_completion_tokens"
    pinned: str | None = None

    def body_for(self, tier: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """The body to send ``tier``: the client's, with ``max_tokens`` as planned."""
        value = self.max_tokens.get(tier)
        return dict(body) if value is None else {**body, self.max_tokens_field: value}


@dataclass(frozen=True)
class Assessment:
    """A request before routing: its class, prompt size and the completion length asked."""

    cls: str
    reason: str
    input_tokens: int
    max_tokens_field: str  # "max_tokens" or "max_completion_tokens"
    max_tokens: int | None  # None: not given
    long_route: bool = False  # re-classed long because the prompt is over max_input_tokens
    # sequences to generate: prompts x max(n, best_of) (gateway/request/tokens/costs.py)
    cost: int = 1
    p_precise: float | None = None  # the classifier model's probability, when it decided
    counted: bool = True  # False: input_tokens is a bound that decided every limit (see assess)
    band: BandQuery | None = None  # the first stage was unsure: the second decides (proxy.py)


async def settle_band(found: Assessment) -> Assessment:
    """An assessment in the first stage's band, decided by the second stage (off the event
    loop, bounded: gateway/request/classify/second_stage.py)."""
    assert found.band is not None
    second = await settle(found.band)
    return dataclasses.replace(
        found, cls=second.cls, reason=second.reason, p_precise=second.p_precise, band=None
    )


def assess(
    body: Mapping[str, Any],
    kind: Kind,
    policy: RoutingPolicy,
    rules: CompiledClasses,
    counter: PromptCounter,
    *,
    context_limit: int | None = None,
    tiers: Sequence[tuple[str, int]] | None = None,
) -> Assessment:
    """Steps 1-3: count the prompt, classify it, apply the gateway-wide prompt limit.

    ``context_limit``: the longest context of any tier (``max_model_len``); a prompt of that
    many tokens fits nowhere, so it is counted only that far and refused (400).
    ``tiers``: every tier's name and ``max_model_len``; given, a prompt whose bound decides
    every limit on all of them (gateway/request/tokens/prompt_bound.py) is not tokenized here: the
    assessment carries the bound (``counted`` False) and the caller counts it later.
    """
    cost = request_cost(body, kind, policy.limits)
    limit = context_limit - 1 if context_limit is not None else None
    if tiers is not None and (bound := bound_prompt(body, kind, counter)) is not None:
        try:
            field, max_tokens = requested_max_tokens(body, kind)
        except APIError:  # a bad max_tokens: the count's errors come first, as without a bound
            bound = None
        if bound is not None and bound_decides(
            bound, max_tokens, tiers, policy.limits, rules.long_min_tokens
        ):
            found = classify_request(body, bound, rules)
            return Assessment(found.cls, found.reason, bound, field, max_tokens, cost=cost,
                              p_precise=found.p_precise, counted=False,
                              band=found.band)  # fmt: skip
    input_tokens = count_prompt(body, kind, counter, limit)
    if limit is not None and input_tokens > limit:
        # Past every tier's context, and past the gateway's own limit when it rejects: say the
        # gateway's limit, the one a client can act on (the count is a lower bound here).
        gate = check_prompt(input_tokens, policy.limits)
        if gate is not None and gate.action == "reject":
            message = gate.message.replace(
                f"resulted in {input_tokens} tokens", f"resulted in more than {limit} tokens"
            )
            raise _too_long(message, "long", "prompt longer than every tier's context", kind)
        raise APIError(
            400,
            f"This model's maximum context length is {context_limit} tokens. However, your "
            f"messages resulted in at least {context_limit} tokens. Please reduce the length "
            "of the messages.",
            INVALID_REQUEST,
            param="messages" if kind is Kind.CHAT else "prompt",
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    field, max_tokens = requested_max_tokens(body, kind)
    found = classify_request(body, input_tokens, rules)
    gate = check_prompt(input_tokens, policy.limits)
    if gate is None:
        return Assessment(
            found.cls,
            found.reason,
            input_tokens,
            field,
            max_tokens,
            cost=cost,
            p_precise=found.p_precise,
            band=found.band,
        )
    if gate.action == "reject":
        raise _too_long(gate.message, found.cls, found.reason, kind)
    reason = f"{found.reason}; {gate.message}"
    return Assessment("long", reason, input_tokens, field, max_tokens, long_route=True, cost=cost)


def plan_route(
    found: Assessment,
    policy: RoutingPolicy,
    statuses: Mapping[str, TierStatus],
    pinned: str | None,
    kind: Kind,
) -> Plan:
    """Steps 4-5: the tiers that may take the request, each with the ``max_tokens`` to send."""
    cls, input_tokens, max_tokens = found.cls, found.input_tokens, found.max_tokens
    request = RouteRequest(cls, input_tokens, max_tokens, pinned)
    decision = choose_tier(list(statuses), statuses, request, policy)
    reason = f"{found.reason} | {decision.reason}"
    if not decision.chain:
        raise _no_chain(decision, request, statuses, policy, reason, kind)

    chain: list[str] = []
    sent: dict[str, int | None] = {}
    for name in decision.chain:
        limit = check_limits(
            input_tokens,
            max_tokens,
            statuses[name].max_model_len,
            policy.limits,
            tier=name,
            long_route=True,  # the gateway-wide prompt limit was applied by assess()
        )
        if limit.action == "reject":
            if chain:
                continue  # a later tier with less room; the earlier ones can take it
            raise APIError(
                400,
                limit.message,
                INVALID_REQUEST,
                param=limit.param,
                code=limit.error_code,
                headers=route_headers(cls, None, reason),
            )
        limits = policy.limits
        keep = max_tokens is None and limits.max_output_tokens is limits.default_max_tokens is None
        sent[name] = None if keep and limit.action == "ok" else limit.max_tokens
        if limit.action == "clamp" and not chain:
            reason = f"{reason}; {limit.message}"
        chain.append(name)
    return Plan(
        cls, _header(reason), input_tokens, tuple(chain), sent, found.max_tokens_field, pinned
    )


def route_headers(cls: str | None, tier: str | None, reason: str | None) -> dict[str, str]:
    """The ``x-route-*`` headers of an answer (missing parts are left out)."""
    headers = {"x-route-class": cls, "x-route-tier": tier, "x-route-reason": reason}
    return {key: _header(value) for key, value in headers.items() if value}


def requested_max_tokens(body: Mapping[str, Any], kind: Kind) -> tuple[str, int | None]:
    """The completion-length field the client used and its value (None: not given). Chat takes
    ``max_completion_tokens`` over ``max_tokens``; each one given must be an integer >= 1 all
    the same (the tier checks both: an unused one that is wrong is the client's error too)."""
    fields = ("max_completion_tokens", "max_tokens") if kind is Kind.CHAT else ("max_tokens",)
    given = [(name, _length(body, name)) for name in fields]
    return next(((name, value) for name, value in given if value is not None), ("max_tokens", None))


def _length(body: Mapping[str, Any], field: str) -> int | None:
    """``body[field]`` as a completion length: absent or null, else an integer >= 1."""
    return None if body.get(field) is None else count_field(body, field, 1, None, default=1)


def _no_chain(
    decision: RouteDecision,
    request: RouteRequest,
    statuses: Mapping[str, TierStatus],
    policy: RoutingPolicy,
    reason: str,
    kind: Kind,
) -> APIError:
    if decision.error == CONTEXT_LENGTH_EXCEEDED:
        longest = max((s.max_model_len for s in statuses.values()), default=0)
        limit = check_limits(request.input_tokens, request.max_tokens, longest, policy.limits)
        if limit.param == "max_tokens":
            return APIError(
                400,
                limit.message,
                INVALID_REQUEST,
                param="max_tokens",
                code=CONTEXT_LENGTH_EXCEEDED,
                headers=route_headers(request.cls, None, reason),
            )
        return _too_long(limit.message, request.cls, reason, kind)
    if decision.error == UNKNOWN_TIER:
        return APIError(
            400,
            f"{decision.reason}; this gateway has {', '.join(statuses) or 'no tier'}",
            INVALID_REQUEST,
            param=policy.pinning.header,
            code=UNKNOWN_TIER,
            headers=route_headers(request.cls, None, reason),
        )
    headers = {"Retry-After": "5", **route_headers(request.cls, None, reason)}
    message = f"no tier can take this request now ({decision.reason}); retry shortly"
    public = "no model server can take this request now; retry shortly"
    return APIError(
        503, _header(message), SERVER_ERROR, code=decision.error, headers=headers, public=public
    )


def _too_long(message: str, cls: str, reason: str, kind: Kind) -> APIError:
    param = "messages" if kind is Kind.CHAT else "prompt"
    return APIError(
        400,
        message,
        INVALID_REQUEST,
        param=param,
        code=CONTEXT_LENGTH_EXCEEDED,
        headers=route_headers(cls, None, reason),
    )


def _header(text: str) -> str:
    text = " ".join(text.encode("ascii", "backslashreplace").decode("ascii").split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."
