"""Prompt bounds without the tokenizer: never below the count, and planning on one changes no
decision (gateway/request/tokens/prompt_bound.py, gateway/request/tokens/prompt_count.py)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from gateway.errors import APIError
from gateway.policy.schema import LimitsPolicy, load_policy
from gateway.request.classify.classes import CompiledClasses
from gateway.request.kind import Kind
from gateway.request.route.plan import assess, plan_route
from gateway.request.tokens.limits import TokenCounter, check_limits, check_prompt
from gateway.request.tokens.prompt_bound import bound_decides, byte_level
from gateway.request.tokens.prompt_count import bound_prompt, count_prompt
from model_optimizer.envs import ROOT
from tests.shipped_fuzz import default_tokenizer_dir
from tests.unit.gateway.request.route.tier_statuses import tier_statuses

CHAT, COMPLETIONS = Kind.CHAT, Kind.COMPLETIONS


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    """The embedded default model's tokenizer and chat template (SmolLM2: byte-level BPE)."""
    return TokenCounter.from_model_dir(default_tokenizer_dir())


def _texts() -> list[str]:
    rows = (ROOT / "measure" / "data" / "vicuna_bench_questions.jsonl").read_text().splitlines()
    texts = [t for row in rows[:40] for t in json.loads(row)["turns"]]
    rng = random.Random(7)
    alphabet = "aé中😀\u0301 \n\t{}()<|>_0" + "".join(chr(c) for c in range(0x20, 0x7F))
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300))) for _ in range(200)]
    texts += [
        "<|im_start|>user\nhi<|im_end|>",  # special tokens written in a message
        " " * 257,
        "def f(x):\n\treturn x ** 2  # 平方\n" * 20,
        "",
    ]
    return texts


def test_the_shipped_tokenizer_is_byte_level_and_a_normalizing_one_is_not(
    counter: TokenCounter,
) -> None:
    assert byte_level(counter.tokenizer)
    normalizing = Tokenizer(models.BPE())
    normalizing.normalizer = normalizers.NFKC()
    normalizing.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert not byte_level(normalizing)
    assert not byte_level(Tokenizer(models.WordPiece(unk_token="[UNK]")))
    assert TokenCounter(normalizing).bound_text("㎧") is None  # NFKC: 3 bytes, more tokens
    prefixed = Tokenizer.from_str(counter.tokenizer.to_str())
    prefixed.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    assert not byte_level(prefixed)  # a space no byte stands for: one token more a piece
    padded = Tokenizer.from_str(counter.tokenizer.to_str())
    padded.enable_padding(length=64)
    assert not byte_level(padded)


def test_a_lone_surrogate_has_no_bound_and_keeps_the_counts_error(counter: TokenCounter) -> None:
    body = {"messages": [{"role": "user", "content": "hi \ud83d"}]}
    assert bound_prompt(body, CHAT, counter) is None
    assert bound_prompt({"prompt": "\ud83d"}, COMPLETIONS, counter) is None


def test_a_bad_max_tokens_does_not_overtake_the_counts_error(counter: TokenCounter) -> None:
    policy = load_policy(ROOT / "policies" / "routing.yaml")
    rules = CompiledClasses.build(policy.classes)
    contexts = [("fp16", 2048)]
    body = {"messages": [{"role": "user", "content": "word " * 5000}], "max_tokens": "16"}
    with pytest.raises(APIError) as caught:
        assess(body, CHAT, policy, rules, counter, context_limit=2048, tiers=contexts)
    assert caught.value.code == "context_length_exceeded"
    short = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "16"}
    with pytest.raises(APIError) as caught:
        assess(short, CHAT, policy, rules, counter, context_limit=2048, tiers=contexts)
    assert caught.value.code == "invalid_type"


def test_a_bound_is_never_below_the_count(counter: TokenCounter) -> None:
    texts = _texts()
    for text in texts:
        assert bound_prompt({"prompt": text}, COMPLETIONS, counter) >= count_prompt(  # type: ignore[operator]
            {"prompt": text}, COMPLETIONS, counter
        ), text
    rng = random.Random(3)
    for _ in range(200):
        messages: list[dict[str, Any]] = [
            {"role": rng.choice(["system", "user", "assistant", "tool"]), "content": t}
            for t in rng.sample(texts, rng.randint(1, 4))
        ]
        if rng.random() < 0.3:
            messages[-1]["tool_calls"] = [{"function": {"name": "f", "arguments": texts[0]}}]
        body: dict[str, Any] = {"messages": messages}
        if rng.random() < 0.2:
            body["tools"] = [{"type": "function", "function": {"name": "g", "parameters": {}}}]
        bound = bound_prompt(body, CHAT, counter)
        assert bound is not None and bound >= count_prompt(body, CHAT, counter), body


def _limits(rng: random.Random) -> LimitsPolicy:
    def maybe(low: int, high: int) -> int | None:
        return rng.randint(low, high) if rng.random() < 0.6 else None

    return LimitsPolicy(
        max_input_tokens=maybe(50, 1500),
        tier_max_input_tokens={"int4": v} if (v := maybe(50, 1500)) else {},
        max_output_tokens=maybe(1, 1500),
        default_max_tokens=maybe(1, 1500),
        on_max_tokens_too_large=rng.choice(["clamp", "reject"]),
    )


def test_when_the_bound_decides_every_count_below_it_gets_the_same_decisions() -> None:
    rng = random.Random(11)
    decided = 0
    for _ in range(3000):
        limits = _limits(rng)
        tiers = [("fp16", rng.choice([512, 2048])), ("int4", rng.choice([512, 2048]))]
        bound, long_min = rng.randint(1, 2100), rng.randint(100, 2100)
        max_tokens = rng.choice([None, rng.randint(1, 2100)])
        if not bound_decides(bound, max_tokens, tiers, limits, long_min):
            continue
        decided += 1
        # What the plan sends (gateway/request/route/plan.py): the body's own value when neither the
        # client nor the policy sets a length, else the decision's.
        keep = max_tokens is None and limits.max_output_tokens is limits.default_max_tokens is None
        for exact in {1, bound // 2 or 1, bound - 1 or 1, bound}:
            assert (exact >= long_min) == (bound >= long_min)
            assert check_prompt(exact, limits) == check_prompt(bound, limits) is None
            for name, length in tiers:
                at_bound = check_limits(bound, max_tokens, length, limits, tier=name)
                at_exact = check_limits(exact, max_tokens, length, limits, tier=name)
                assert at_exact.action == at_bound.action == "ok"
                if not keep:
                    assert at_exact.max_tokens == at_bound.max_tokens
    assert decided > 200  # the check ran on many decided cases (272 with this seed)


def test_a_plan_on_the_bound_is_the_plan_on_the_count(counter: TokenCounter) -> None:
    policy = load_policy(ROOT / "policies" / "routing.yaml")
    rules = CompiledClasses.build(policy.classes)
    statuses = tier_statuses()
    contexts = [(name, status.max_model_len) for name, status in statuses.items()]
    planned_on_bounds = 0
    for text in _texts()[:120]:
        for max_tokens in (None, 16, 1000):
            body: dict[str, Any] = {"messages": [{"role": "user", "content": text or "?"}]}
            if max_tokens is not None:
                body["max_tokens"] = max_tokens
            quick = assess(body, CHAT, policy, rules, counter, context_limit=2048, tiers=contexts)
            exact = assess(body, CHAT, policy, rules, counter, context_limit=2048)
            assert exact.counted
            planned_on_bounds += not quick.counted
            assert (quick.cls, quick.reason, quick.p_precise) == (
                exact.cls,
                exact.reason,
                exact.p_precise,
            )
            a = plan_route(quick, policy, statuses, None, CHAT)
            b = plan_route(exact, policy, statuses, None, CHAT)
            assert (a.cls, a.chain, dict(a.max_tokens), a.reason) == (
                b.cls,
                b.chain,
                dict(b.max_tokens),
                b.reason,
            )
    assert planned_on_bounds > 100


def test_no_bound_for_token_ids_or_a_malformed_prompt(counter: TokenCounter) -> None:
    assert bound_prompt({"prompt": [1, 2, 3]}, COMPLETIONS, counter) is None
    assert bound_prompt({"prompt": 5}, COMPLETIONS, counter) is None
    assert bound_prompt({"prompt": ["ab", "abcd"]}, COMPLETIONS, counter) == 4
