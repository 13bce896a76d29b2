"""Routing: which tiers, in which order, may take a request. A pure function of plain values.

``choose_tier(candidates, statuses, request, policy)`` takes the route of the request's class
(policies/routing.yaml ``routes``), keeps the tiers the gateway has (``candidates``) in the
route's order, and drops the ones that cannot take the request now:

- not ``ready`` (starting, draining, resetting, down) or without a status at all;
- not admitted for the request's class by the in-engine check (``TierStatus.classes``);
- saturated: ``requests_waiting`` or ``kv_usage`` above the policy's ``saturation`` thresholds;
- too short: ``input_tokens`` + the completion tokens that must fit exceed ``max_model_len``
  (the whole ``max_tokens`` when the policy rejects an oversized one, one token when it clamps,
  since gateway/request/tokens/limits.py then lowers it), or above the tier's
  ``limits.tier_max_input_tokens``.

A ``most_free_kv`` route orders the remaining tiers by KV-cache usage, lowest first (the route's
order breaks ties). The first tier of the chain answers; the next ones take over on a connect
error or a 503 before the first byte.

Pinning: with ``pinning.allow``, a request naming a tier (``RouteRequest.pinned``, from the
policy's header) gets exactly that tier, skipping the route; a pinned tier that is unknown, not
ready or too short is an error decision (empty chain, ``error`` set); a saturated one is still
used (the operator asked for it). Without ``pinning.allow`` the pin is ignored and the reason
says so.

An empty chain always comes with ``error``: ``context_length_exceeded`` when every configured
tier of the route is too short, whatever its state (a 400 for the client); ``tier_not_ready``
or ``unknown_tier`` for a pin; ``no_route`` for a class without a route; ``no_tier_available``
otherwise (a 503).
Reasons are one ASCII line, fit for the ``x-route-reason`` header.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from backends.tier_state import TierState
from gateway.policy.schema import RoutingPolicy

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
TIER_NOT_READY = "tier_not_ready"
UNKNOWN_TIER = "unknown_tier"
NO_ROUTE = "no_route"
NO_TIER_AVAILABLE = "no_tier_available"


@dataclass(frozen=True)
class TierStatus:
    """What the gateway knows about one tier: supervisor state and last scraped metrics."""

    name: str
    state: TierState
    requests_waiting: float  # vllm:num_requests_waiting
    kv_usage: float  # vllm:kv_cache_usage_perc, 0..1
    max_model_len: int  # prompt + completion tokens the tier accepts
    # Classes the in-engine admission check let this tier serve (None: every class).
    classes: frozenset[str] | None = None


@dataclass(frozen=True)
class RouteRequest:
    """The request as routing sees it."""

    cls: str  # tolerant | code | math | long (gateway/request/classify/classes.py)
    input_tokens: int  # prompt tokens, chat template applied
    max_tokens: int | None = None  # as the client asked (None: not given)
    pinned: str | None = None  # tier named by the pinning header


@dataclass(frozen=True)
class RouteDecision:
    """Tiers to try in order; an empty chain has an ``error`` code."""

    chain: list[str]
    reason: str
    error: str | None = None
    skipped: Mapping[str, str] = field(default_factory=dict)  # tier -> why it was left out


def choose_tier(
    candidates: Sequence[str],
    statuses: Mapping[str, TierStatus],
    request: RouteRequest,
    policy: RoutingPolicy,
) -> RouteDecision:
    """The ordered chain of tiers that may take ``request`` now (see the module docstring)."""
    note = ""
    if request.pinned is not None:
        if policy.pinning.allow:
            return _pinned(request.pinned, candidates, statuses, request, policy)
        note = f"; pin {_ascii(request.pinned)} ignored (pinning is off)"
    route = policy.routes.for_class(request.cls)
    if route is None:
        reason = f"no route for class {_ascii(request.cls)}{note}"
        return RouteDecision([], reason, NO_ROUTE)

    skipped: dict[str, str] = {}
    usable: list[TierStatus] = []
    for name in route.tiers:
        if name not in candidates:
            skipped[name] = "not configured"
            continue
        status = statuses.get(name)
        why = _unusable(status, request, policy, saturation=True)
        if why is not None or status is None:
            skipped[name] = why or "no status"
            continue
        usable.append(status)
    if route.strategy == "most_free_kv":
        usable.sort(key=lambda status: status.kv_usage)  # stable: ties keep the route's order

    chain = [status.name for status in usable]
    head = f"{request.cls} -> {', '.join(chain) if chain else 'no tier'}"
    if route.strategy == "most_free_kv" and chain:
        head += " (most free KV: " + ", ".join(f"{s.name} {s.kv_usage:.2f}" for s in usable) + ")"
    reason = head + _skipped(skipped) + note
    if chain:
        return RouteDecision(chain, reason, None, skipped)
    return RouteDecision([], reason, _empty_chain_error(skipped), skipped)


def _pinned(
    name: str,
    candidates: Sequence[str],
    statuses: Mapping[str, TierStatus],
    request: RouteRequest,
    policy: RoutingPolicy,
) -> RouteDecision:
    shown = _ascii(name)
    if name not in policy.tiers or name not in candidates:
        return RouteDecision([], f"pinned to unknown tier {shown}", UNKNOWN_TIER)
    status = statuses.get(name)
    why = _unusable(status, request, policy, saturation=False)
    if status is None or why is not None:
        why = why or "no status"
        error = CONTEXT_LENGTH_EXCEEDED if why.startswith("too short") else TIER_NOT_READY
        return RouteDecision([], f"pinned to {shown}, which is {why}", error, {name: why})
    saturated = _saturated(status, policy)
    suffix = f" (saturated: {saturated}, used anyway)" if saturated else ""
    return RouteDecision([name], f"pinned to {shown}{suffix}")


def _unusable(
    status: TierStatus | None, request: RouteRequest, policy: RoutingPolicy, *, saturation: bool
) -> str | None:
    """Why the tier cannot take the request now, or ``None``."""
    if status is None:
        return "no status"
    # Length first: a request too long for every tier is the client's error, whatever the
    # tiers' states.
    cap = policy.limits.tier_input_cap(status.name)
    if cap is not None and request.input_tokens > cap:
        return f"too short: {request.input_tokens} prompt tokens > tier cap {cap}"
    needed = request.input_tokens + _output_reserve(request, policy)
    if needed > status.max_model_len:
        return f"too short: needs {needed} tokens > max_model_len {status.max_model_len}"
    if status.classes is not None and request.cls not in status.classes:
        return f"not admitted for {_ascii(request.cls)}"
    if status.state != TierState.READY:
        return _ascii(status.state)
    if saturation:
        saturated = _saturated(status, policy)
        if saturated:
            return f"saturated: {saturated}"
    return None


def _output_reserve(request: RouteRequest, policy: RoutingPolicy) -> int:
    """Completion tokens that must fit beside the prompt on a tier."""
    if request.max_tokens is not None and policy.limits.on_max_tokens_too_large == "reject":
        return max(request.max_tokens, 1)
    return 1  # clamping (gateway/request/tokens/limits.py) fits max_tokens to whatever room is left


def _saturated(status: TierStatus, policy: RoutingPolicy) -> str:
    limits = policy.saturation
    if status.requests_waiting > limits.max_requests_waiting:
        return f"{status.requests_waiting:g} waiting > {limits.max_requests_waiting:g}"
    if status.kv_usage > limits.max_kv_usage:
        return f"KV {status.kv_usage:.2f} > {limits.max_kv_usage:.2f}"
    return ""


def _empty_chain_error(skipped: Mapping[str, str]) -> str:
    """``context_length_exceeded`` when every configured tier of the route is too short."""
    configured = [why for why in skipped.values() if why != "not configured"]
    if configured and all(why.startswith("too short") for why in configured):
        return CONTEXT_LENGTH_EXCEEDED
    return NO_TIER_AVAILABLE


def _skipped(skipped: Mapping[str, str]) -> str:
    if not skipped:
        return ""
    return "; skipped " + ", ".join(f"{name} ({why})" for name, why in skipped.items())


def _ascii(text: str) -> str:
    return text.encode("ascii", "backslashreplace").decode("ascii")
