"""assess and plan_route: counting, classification, limits, the chain with per-tier max_tokens."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import APIError
from gateway.policy.schema import RoutingPolicy, load_policy
from gateway.request.classify.classes import CompiledClasses
from gateway.request.kind import Kind
from gateway.request.route.plan import (
    Plan,
    assess,
    plan_route,
    requested_max_tokens,
    route_headers,
)
from gateway.request.route.router import TierStatus
from gateway.request.tokens.limits import TokenCounter
from gateway.request.tokens.prompt_count import ByteCounter, count_prompt
from model_optimizer.envs import ROOT
from tests.unit.gateway.request.route.tier_statuses import tier_statuses

CHAT = Kind.CHAT
COMPLETIONS = Kind.COMPLETIONS
SHIPPED = load_policy(ROOT / "policies" / "routing.yaml")
RULES = CompiledClasses.build(SHIPPED.classes)


def _plan(
    body: dict[str, Any],
    kind: Kind = CHAT,
    policy: RoutingPolicy = SHIPPED,
    statuses: dict[str, TierStatus] | None = None,
    pinned: str | None = None,
) -> Plan:
    rules = RULES if policy is SHIPPED else CompiledClasses.build(policy.classes)
    found = assess(body, kind, policy, rules, ByteCounter())
    return plan_route(found, policy, statuses or tier_statuses(), pinned, kind)


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], **extra}


def test_code_goes_to_fp16_and_chit_chat_to_int4() -> None:
    code = _plan(_chat("Write a Python function that reverses a linked list."))
    assert (code.cls, code.chain) == ("code", ("fp16", "int8"))
    chat = _plan(_chat("Write a short poem about autumn in Paris."))
    assert (chat.cls, chat.chain) == ("tolerant", ("int4", "int8", "fp16"))
    assert chat.reason.startswith("tolerant") and "| tolerant -> int4" in chat.reason


def test_body_is_untouched_without_max_tokens_and_clamped_when_too_large() -> None:
    body = _chat("Hi there")
    no_default = SHIPPED.model_copy(
        update={"limits": SHIPPED.limits.model_copy(update={"default_max_tokens": None})}
    )
    plan = _plan(body, policy=no_default)
    assert plan.body_for("int4", body) == body
    big = _chat("Hi there", max_tokens=100_000)
    clamped = _plan(big)
    sent = clamped.body_for("int4", big)["max_tokens"]
    assert 0 < sent < 2048
    assert "lowered to" in clamped.reason


def test_without_max_tokens_the_shipped_default_is_sent() -> None:
    body = _chat("Hi there")
    plan = _plan(body)
    assert SHIPPED.limits.default_max_tokens == 1024
    assert plan.body_for("int4", body) == {**body, "max_tokens": 1024}


def test_max_completion_tokens_is_the_field_clamped_when_given() -> None:
    body = _chat("Hi there", max_completion_tokens=50_000)
    plan = _plan(body)
    assert plan.max_tokens_field == "max_completion_tokens"
    assert plan.body_for("int4", body)["max_completion_tokens"] < 2048


def test_prompt_over_the_gateway_limit_is_context_length_exceeded() -> None:
    with pytest.raises(APIError) as caught:
        _plan(_chat("word " * 2000))  # > max_input_tokens (1536) by the byte bound
    error = caught.value
    assert (error.status, error.code, error.param) == (400, "context_length_exceeded", "messages")
    assert "1536" in error.message
    assert error.headers["x-route-class"] == "long"


def test_prompt_over_the_limit_goes_long_when_the_policy_says_so() -> None:
    policy = SHIPPED.model_copy(
        update={"limits": SHIPPED.limits.model_copy(update={"on_input_too_long": "route_long"})}
    )
    plan = _plan(_chat("word " * 400), policy=policy)  # ~2,000 bytes > 1,536
    assert plan.cls == "long"
    assert "long route" in plan.reason


def test_prompt_longer_than_every_tier_is_refused_even_via_the_long_route() -> None:
    policy = SHIPPED.model_copy(
        update={"limits": SHIPPED.limits.model_copy(update={"on_input_too_long": "route_long"})}
    )
    with pytest.raises(APIError) as caught:
        _plan(_chat("word " * 1000), policy=policy)  # 5,000 bytes > every max_model_len
    assert caught.value.code == "context_length_exceeded"
    assert "2048" in caught.value.message


def test_reject_policy_refuses_max_tokens_beyond_the_tier() -> None:
    policy = SHIPPED.model_copy(
        update={"limits": SHIPPED.limits.model_copy(update={"on_max_tokens_too_large": "reject"})}
    )
    with pytest.raises(APIError) as caught:
        _plan(_chat("Hi", max_tokens=4000), policy=policy)
    assert (caught.value.status, caught.value.param) == (400, "max_tokens")
    assert caught.value.code == "context_length_exceeded"


def test_tiers_not_ready_or_saturated_are_skipped() -> None:
    statuses = tier_statuses(int4={"state": "draining"}, int8={"requests_waiting": 10.0})
    plan = _plan(_chat("Write a short poem about autumn in Paris."), statuses=statuses)
    assert plan.chain == ("fp16",)
    assert "int4 (draining)" in plan.reason and "int8 (saturated" in plan.reason


def test_no_ready_tier_is_503_with_retry_after() -> None:
    statuses = tier_statuses(**{name: {"state": "down"} for name in ("fp16", "int8", "int4")})
    with pytest.raises(APIError) as caught:
        _plan(_chat("Hi"), statuses=statuses)
    assert (caught.value.status, caught.value.code) == (503, "no_tier_available")
    assert caught.value.headers["Retry-After"] == "5"


def test_pin_is_ignored_unless_allowed_and_unknown_pin_is_400() -> None:
    plan = _plan(_chat("Hi"), pinned="fp16")
    assert plan.chain[0] == "int4" and "ignored" in plan.reason
    allowed = SHIPPED.model_copy(
        update={"pinning": SHIPPED.pinning.model_copy(update={"allow": True})}
    )
    assert _plan(_chat("Hi"), policy=allowed, pinned="fp16").chain == ("fp16",)
    with pytest.raises(APIError) as caught:
        _plan(_chat("Hi"), policy=allowed, pinned="fp64")
    assert (caught.value.status, caught.value.code) == (400, "unknown_tier")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages"),
        ({"messages": [{"role": "user", "content": {"text": "x"}}]}, "messages"),
        ({}, "messages"),
    ],
)
def test_malformed_messages_are_400(body: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as caught:
        _plan(body)
    assert (caught.value.status, caught.value.param) == (400, param)


@pytest.mark.parametrize("content", [None, "", "Hi", [{"type": "text", "text": "Hi"}]])
def test_message_content_may_be_a_string_parts_or_null(content: Any) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": content}]
    assert isinstance(_plan({"messages": messages}), Plan)


@pytest.mark.parametrize("value", ["10", 1.5, True, [1]])
def test_max_tokens_of_the_wrong_type_is_400(value: Any) -> None:
    with pytest.raises(APIError) as caught:
        _plan(_chat("Hi", max_tokens=value))
    assert (caught.value.status, caught.value.code) == (400, "invalid_type")


def test_completions_prompts_of_every_shape_are_counted() -> None:
    counter = ByteCounter()
    assert count_prompt({"prompt": "abc"}, COMPLETIONS, counter) == 4
    assert count_prompt({"prompt": ["a", "abcdef"]}, COMPLETIONS, counter) == 7
    assert count_prompt({"prompt": [1, 2, 3]}, COMPLETIONS, counter) == 3
    assert count_prompt({"prompt": [[1], [1, 2]]}, COMPLETIONS, counter) == 2
    # Booleans are ints to Python, not token ids (found by benchmarks/bench_fuzz.py).
    for bad in (None, 5, [], [1, "a"], [True, 1], [[True], [False]], [[1], [2, False]]):
        with pytest.raises(APIError):
            count_prompt({"prompt": bad}, COMPLETIONS, counter)


def test_the_real_tokenizer_counts_fewer_tokens_than_the_byte_bound(tmp_path: Any) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"hello": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    counter = TokenCounter(tokenizer)
    body = {"prompt": "hello hello hello"}
    assert count_prompt(body, COMPLETIONS, counter) == 3
    assert count_prompt(body, COMPLETIONS, ByteCounter()) > 3


def test_route_headers_are_ascii_and_bounded() -> None:
    headers = route_headers("code", "fp16", "π " + "x" * 1000)
    assert headers["x-route-reason"].isascii()
    assert len(headers["x-route-reason"]) <= 400
    assert route_headers(None, None, "r") == {"x-route-reason": "r"}


def test_the_assessment_carries_the_models_probability() -> None:
    code = assess(
        _chat("Write a Python function that sorts a list."), CHAT, SHIPPED, RULES, ByteCounter()
    )
    assert code.cls == "code" and code.p_precise is not None and code.p_precise > 0.5
    lists = assess(
        {"prompt": ["Tell me a joke", "Solve 3x + 5 = 20"]},
        COMPLETIONS,
        SHIPPED,
        RULES,
        ByteCounter(),
    )
    assert lists.cls == "math" and "2 prompts, #2 decides" in lists.reason


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        (CHAT, _chat("word " * 200_000), "messages"),
        (COMPLETIONS, {"prompt": "word " * 200_000}, "prompt"),
        (COMPLETIONS, {"prompt": ["short", "word " * 200_000]}, "prompt"),
    ],
)
def test_a_prompt_past_every_context_is_refused_after_bounded_counting(
    kind: Kind, body: dict[str, Any], param: str
) -> None:
    counted: list[int | None] = []

    class Counting(ByteCounter):
        def count_text(self, text: str, *, limit: int | None = None) -> int:
            counted.append(limit)
            return super().count_text(text, limit=limit)

        def count_chat(self, messages: Any, *, limit: int | None = None) -> int:
            counted.append(limit)
            return super().count_chat(messages, limit=limit)

    with pytest.raises(APIError) as caught:
        assess(body, kind, SHIPPED, RULES, Counting(), context_limit=2048)
    error = caught.value
    assert (error.status, error.code, error.param) == (400, "context_length_exceeded", param)
    # the shipped policy rejects past 1536 prompt tokens: that is the limit the client is told
    assert "at most 1536 prompt tokens" in error.message
    assert "more than 2047 tokens" in error.message
    assert counted and set(counted) == {2047}  # counted only as far as the longest context
    without = SHIPPED.model_copy(
        update={"limits": SHIPPED.limits.model_copy(update={"max_input_tokens": None})}
    )
    with pytest.raises(APIError) as caught:
        assess(body, kind, without, RULES, Counting(), context_limit=2048)
    assert "at least 2048 tokens" in caught.value.message


def test_tools_count_as_prompt_tokens() -> None:
    # The chat template renders the tools' schemas into the prompt: uncounted, a request with
    # a big tools list passed every prompt limit.
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up. " * 20,
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
    bare = count_prompt(_chat("Hi"), CHAT, ByteCounter())
    with_tools = count_prompt(_chat("Hi", tools=[tool] * 3), CHAT, ByteCounter())
    assert with_tools - bare > 3 * len("Look a word up. " * 20)
    with pytest.raises(APIError) as caught:
        _plan(_chat("Hi", tools=[tool] * 10))  # over the shipped max_input_tokens (1536)
    assert caught.value.code == "context_length_exceeded"


@pytest.mark.parametrize(
    ("body", "kind", "expected"),
    [
        ({"max_completion_tokens": 5, "max_tokens": 9}, Kind.CHAT, ("max_completion_tokens", 5)),
        ({"max_completion_tokens": None, "max_tokens": 7}, Kind.CHAT, ("max_tokens", 7)),
        ({"max_completion_tokens": 5}, Kind.COMPLETIONS, ("max_tokens", None)),
        ({}, Kind.CHAT, ("max_tokens", None)),
    ],
)
def test_the_completion_length_field_the_client_used(
    body: dict[str, Any], kind: Kind, expected: tuple[str, int | None]
) -> None:
    assert requested_max_tokens(body, kind) == expected


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        # The unused field is checked too: the fuzz run found max_tokens -1609 beside a valid
        # max_completion_tokens answered 200 (and forwarded to a tier that refuses it).
        ({"max_completion_tokens": 1, "max_tokens": -1609}, "max_tokens", "invalid_value"),
        ({"max_completion_tokens": 1, "max_tokens": [None]}, "max_tokens", "invalid_type"),
        ({"max_completion_tokens": 0}, "max_completion_tokens", "invalid_value"),
        ({"max_tokens": True}, "max_tokens", "invalid_type"),
    ],
)
def test_each_given_completion_length_must_be_an_integer_of_at_least_one(
    body: dict[str, Any], field: str, code: str
) -> None:
    with pytest.raises(APIError) as refused:
        requested_max_tokens(body, Kind.CHAT)
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, field, code)
