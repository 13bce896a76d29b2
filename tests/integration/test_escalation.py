"""Escalation on the real stack: a tier forced into a loop (logit bias on one token) is cut
and its answer continued on the next tier of the chain, in one stream
(gateway/request/stream/stream_watch.py, gateway/request/stream/resume.py)."""

from __future__ import annotations

import json

import httpx
import pytest
from tokenizers import Tokenizer

from model_optimizer.envs import cache_root
from tests.integration.conftest import MODEL, Stack, apply_policy, route_chain

pytestmark = pytest.mark.integration
PROMPTS = ("Hi! How are you doing today?", "Write a Python function that adds two numbers.")
SHIPPED = "escalation:\n  tiers: [int4]\n"


@pytest.mark.slow
def test_a_looping_tier_is_cut_and_its_answer_continued_on_the_next(stack: Stack) -> None:
    prompt, chain = next(
        ((p, c) for p in PROMPTS if len(c := route_chain(stack, p)) >= 2), (None, [])
    )
    assert prompt is not None, "no class routes to two tiers on this machine"
    watched = chain[0]
    tokenizer = Tokenizer.from_file(
        str(cache_root() / "variants" / MODEL / "fp16" / "tokenizer.json")
    )
    token = tokenizer.encode(" Paris", add_special_tokens=False).ids[0]
    unit = tokenizer.decode([token])  # what the biased tiers say again and again
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 48,
        "temperature": 0,
        "logit_bias": {str(token): 100},  # every tier says " Paris" again and again
        "stream": True,
    }
    original = stack.policy.read_text()
    assert SHIPPED in original
    try:
        apply_policy(stack, original.replace(SHIPPED, f"escalation:\n  tiers: [{watched}]\n"))
        with httpx.stream(
            "POST", f"{stack.gateway_url}/v1/chat/completions", json=body, timeout=120
        ) as answer:
            assert answer.status_code == 200
            lines = [line for line in answer.iter_lines() if line]
    finally:
        apply_policy(stack, original)
    payloads = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert not [p for p in payloads if "error" in p], lines[-3:]
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
    assert len({p["id"] for p in payloads}) == 1
    comments = [i for i, line in enumerate(lines) if line.startswith(": answer continued")]
    assert len(comments) == 1, lines
    expected = f": answer continued on tier {chain[1]} after tier {watched} degenerated (loop)"
    assert lines[comments[0]] == expected

    def texts(part: list[str]) -> list[str]:
        events = [json.loads(line[6:]) for line in part if line.startswith("data: {")]
        return [c["delta"].get("content") or "" for e in events for c in e["choices"]]

    before, after = texts(lines[: comments[0]]), texts(lines[comments[0] :])
    # The loop was found within the held text: the client got its first occurrence only.
    assert [t for t in before if t] == [unit], before
    assert "".join(after).startswith(unit * 2)  # the next tier, biased alike, goes on
    metrics = httpx.get(f"{stack.gateway_url}/metrics", timeout=10).text
    assert f'from_tier="{watched}",kind="loop",to_tier="{chain[1]}"' in metrics
