from typing import Any

import pytest

from gateway.policy.schema import RoutingPolicy, parse_policy
from gateway.request.route.router import (
    CONTEXT_LENGTH_EXCEEDED,
    NO_ROUTE,
    NO_TIER_AVAILABLE,
    TIER_NOT_READY,
    UNKNOWN_TIER,
    RouteRequest,
    TierStatus,
    choose_tier,
)
from tests.unit.gateway.request.route.tier_statuses import TIERS, tier_statuses

POLICY = """\
tiers: [fp16, int8, int4]
routes:
  tolerant: [int4, int8, fp16]
  code: [fp16, int8]
  math: [fp16, int8]
  long: {strategy: most_free_kv, tiers: [fp16, int8, int4]}
saturation: {max_requests_waiting: 4, max_kv_usage: 0.9}
"""


def _policy(extra: str = "") -> RoutingPolicy:
    return parse_policy(POLICY + extra, "t.yaml")


def _route(
    cls: str = "tolerant",
    statuses: dict[str, TierStatus] | None = None,
    policy: RoutingPolicy | None = None,
    candidates: list[str] | None = None,
    **request: Any,
) -> Any:
    return choose_tier(
        TIERS if candidates is None else candidates,
        tier_statuses() if statuses is None else statuses,
        RouteRequest(cls=cls, input_tokens=request.pop("input_tokens", 100), **request),
        policy or _policy(),
    )


def test_each_class_gets_its_route_in_order() -> None:
    assert _route("tolerant").chain == ["int4", "int8", "fp16"]
    assert _route("code").chain == ["fp16", "int8"]
    assert _route("math").chain == ["fp16", "int8"]
    decision = _route("tolerant")
    assert decision.error is None
    assert decision.reason == "tolerant -> int4, int8, fp16"


@pytest.mark.parametrize("state", ["starting", "draining", "resetting", "down"])
def test_tiers_that_are_not_ready_are_skipped(state: str) -> None:
    decision = _route("tolerant", tier_statuses(int4={"state": state}))
    assert decision.chain == ["int8", "fp16"]
    assert decision.skipped == {"int4": state}
    assert decision.reason == f"tolerant -> int8, fp16; skipped int4 ({state})"


def test_a_tier_without_a_status_is_skipped() -> None:
    statuses = tier_statuses()
    del statuses["int8"]
    decision = _route("code", statuses)
    assert decision.chain == ["fp16"]
    assert decision.skipped == {"int8": "no status"}


def test_a_tier_the_gateway_does_not_have_is_skipped() -> None:
    decision = _route("tolerant", candidates=["fp16", "int8"])
    assert decision.chain == ["int8", "fp16"]
    assert decision.skipped == {"int4": "not configured"}


def test_saturated_tiers_are_skipped() -> None:
    statuses = tier_statuses(int4={"requests_waiting": 5}, int8={"kv_usage": 0.95})
    decision = _route("tolerant", statuses)
    assert decision.chain == ["fp16"]
    assert decision.skipped == {
        "int4": "saturated: 5 waiting > 4",
        "int8": "saturated: KV 0.95 > 0.90",
    }


def test_saturation_thresholds_are_exclusive() -> None:
    statuses = tier_statuses(int4={"requests_waiting": 4, "kv_usage": 0.9})
    assert _route("tolerant", statuses).chain == ["int4", "int8", "fp16"]


def test_long_goes_to_the_most_free_kv_first() -> None:
    statuses = tier_statuses(fp16={"kv_usage": 0.7}, int8={"kv_usage": 0.2}, int4={"kv_usage": 0.5})
    decision = _route("long", statuses, input_tokens=1500)
    assert decision.chain == ["int8", "int4", "fp16"]
    assert "most free KV: int8 0.20, int4 0.50, fp16 0.70" in decision.reason


def test_most_free_kv_ties_keep_the_route_order_and_skip_saturated() -> None:
    statuses = tier_statuses(
        fp16={"kv_usage": 0.3}, int8={"kv_usage": 0.3}, int4={"kv_usage": 0.95}
    )
    assert _route("long", statuses).chain == ["fp16", "int8"]


def test_tiers_too_short_for_the_prompt_are_skipped() -> None:
    statuses = tier_statuses(int4={"max_model_len": 1024})
    decision = _route("tolerant", statuses, input_tokens=1024)
    assert decision.chain == ["int8", "fp16"]
    assert decision.skipped == {"int4": "too short: needs 1025 tokens > max_model_len 1024"}
    assert _route("tolerant", statuses, input_tokens=1023).chain[0] == "int4"


def test_max_tokens_must_fit_when_the_policy_rejects_oversized_ones() -> None:
    statuses = tier_statuses(int4={"max_model_len": 1024})
    rejecting = _policy("limits: {on_max_tokens_too_large: reject}\n")
    decision = _route("tolerant", statuses, rejecting, input_tokens=900, max_tokens=200)
    assert decision.chain == ["int8", "fp16"]
    assert decision.skipped["int4"] == "too short: needs 1100 tokens > max_model_len 1024"
    # Clamping: only the prompt (and one token) must fit; limits.py lowers max_tokens.
    clamping = _policy("limits: {on_max_tokens_too_large: clamp}\n")
    decision = _route("tolerant", statuses, clamping, input_tokens=900, max_tokens=200)
    assert decision.chain == ["int4", "int8", "fp16"]


def test_a_tier_prompt_cap_excludes_it() -> None:
    policy = _policy("limits: {tier_max_input_tokens: {int4: 512}}\n")
    decision = _route("tolerant", policy=policy, input_tokens=600)
    assert decision.chain == ["int8", "fp16"]
    assert decision.skipped == {"int4": "too short: 600 prompt tokens > tier cap 512"}


def test_nothing_usable_gives_an_empty_chain_and_a_reason() -> None:
    down = {"state": "down"}
    decision = _route("code", tier_statuses(fp16=down, int8={"state": "draining"}))
    assert decision.chain == []
    assert decision.error == NO_TIER_AVAILABLE
    assert decision.reason == "code -> no tier; skipped fp16 (down), int8 (draining)"


def test_a_prompt_too_long_for_every_tier_is_the_clients_error() -> None:
    statuses = tier_statuses(int8={"state": "draining"})
    decision = _route("code", statuses, input_tokens=4000)
    assert decision.chain == []
    assert decision.error == CONTEXT_LENGTH_EXCEEDED


def test_too_short_and_not_ready_is_not_a_length_error() -> None:
    statuses = tier_statuses(fp16={"max_model_len": 8192, "state": "down"})
    decision = _route("code", statuses, input_tokens=4000)
    assert decision.chain == []
    assert decision.error == NO_TIER_AVAILABLE


def test_an_unknown_class_has_no_route() -> None:
    decision = _route("poetry")
    assert (decision.chain, decision.error) == ([], NO_ROUTE)
    assert decision.reason == "no route for class poetry"


# --------------------------------------------------------------------------- pinning

PINNABLE = "pinning: {allow: true}\n"


def test_a_pin_is_ignored_when_pinning_is_off() -> None:
    decision = _route("tolerant", pinned="fp16")
    assert decision.chain == ["int4", "int8", "fp16"]
    assert decision.reason.endswith("; pin fp16 ignored (pinning is off)")


def test_an_allowed_pin_gets_exactly_that_tier() -> None:
    decision = _route("tolerant", policy=_policy(PINNABLE), pinned="fp16")
    assert decision.chain == ["fp16"]
    assert decision.reason == "pinned to fp16"
    assert decision.error is None


def test_a_pin_outside_the_class_route_is_honoured() -> None:
    assert _route("code", policy=_policy(PINNABLE), pinned="int4").chain == ["int4"]


def test_a_pin_to_a_tier_that_is_not_ready_is_an_error() -> None:
    statuses = tier_statuses(fp16={"state": "draining"})
    decision = _route("tolerant", statuses, _policy(PINNABLE), pinned="fp16")
    assert decision.chain == []
    assert decision.error == TIER_NOT_READY
    assert decision.reason == "pinned to fp16, which is draining"


def test_a_pin_to_an_unknown_tier_is_an_error() -> None:
    decision = _route("tolerant", policy=_policy(PINNABLE), pinned="int2")
    assert (decision.chain, decision.error) == ([], UNKNOWN_TIER)
    not_served = _route("tolerant", policy=_policy(PINNABLE), candidates=["int8"], pinned="fp16")
    assert (not_served.chain, not_served.error) == ([], UNKNOWN_TIER)


def test_a_pin_to_a_saturated_tier_is_used_anyway() -> None:
    statuses = tier_statuses(int8={"kv_usage": 0.99})
    decision = _route("tolerant", statuses, _policy(PINNABLE), pinned="int8")
    assert decision.chain == ["int8"]
    assert decision.reason == "pinned to int8 (saturated: KV 0.99 > 0.90, used anyway)"


def test_a_pin_to_a_tier_too_short_is_a_length_error() -> None:
    decision = _route("tolerant", policy=_policy(PINNABLE), pinned="int8", input_tokens=3000)
    assert (decision.chain, decision.error) == ([], CONTEXT_LENGTH_EXCEEDED)


def test_reasons_are_ascii() -> None:
    decision = _route("tolerant", policy=_policy(PINNABLE), pinned="fp16\u2192")
    assert decision.reason.isascii()
    assert decision.error == UNKNOWN_TIER


def test_a_tier_not_admitted_for_the_class_is_skipped_with_the_reason() -> None:
    statuses = tier_statuses(int8={"classes": frozenset({"tolerant"})})
    decision = _route("code", statuses)
    assert decision.chain == ["fp16"]
    assert decision.skipped == {"int8": "not admitted for code"}
    assert "int8 (not admitted for code)" in decision.reason
    assert _route("tolerant", statuses).chain == ["int4", "int8", "fp16"]


def test_a_class_whose_every_tier_is_not_admitted_has_no_tier() -> None:
    statuses = tier_statuses(
        fp16={"classes": frozenset({"tolerant"})}, int8={"classes": frozenset()}
    )
    decision = _route("math", statuses)
    assert decision.chain == []
    assert decision.error == NO_TIER_AVAILABLE
