"""The llama.cpp stack (``up --engine llama.cpp``, what ``up`` serves on a CPU-only host): the
official client through the gateway to llama-server tiers, routes derived from what was
measured in the engine, length limits, KV resets by slot erase, a tier killed mid-stream, a
looping tier escalated, supervision."""

from __future__ import annotations

import json
import os

import httpx
import openai
import pytest
from tokenizers import Tokenizer

from model_optimizer.soak import reset_now
from tests.integration.conftest import (
    ADMIN,
    ADMIN_KEY,
    MODEL,
    Stack,
    apply_policy,
    route_chain,
    wait_tier_back,
)

pytestmark = pytest.mark.integration
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TOLERANT = "Hi! How are you doing today?"
CODE = "Write a Python function that adds two numbers."
SHIPPED_ESCALATION = "escalation:\n  tiers: [int4]\n"


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="unused", timeout=120)


def _tiers(stack: Stack) -> dict[str, dict[str, object]]:
    answer = httpx.get(f"{stack.gateway_url}/admin/tiers", headers=ADMIN, timeout=10)
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["tiers"])


def test_up_says_which_engine_and_why_and_the_tiers_run_llama_server(llama_stack: Stack) -> None:
    log = llama_stack.log_text()
    assert "up: engine llama.cpp: asked for" in log
    for tier in ("fp16", "int8", "int4"):
        cmd = llama_stack.tier_process(tier).cmdline()
        assert cmd[0].endswith("llama-server")
        assert cmd[cmd.index("--model") + 1].endswith(f"-gguf/{tier}/model.gguf")
        # the tier's key is in its environment, never in its command line
        assert "LLAMA_API_KEY" in llama_stack.tier_process(tier).environ()
        assert not any("integration-tier-key" in part for part in cmd)
    # llama-server wants the key on everything but /health
    bare = httpx.get(f"{llama_stack.tier_urls['int4']}/metrics", timeout=10)
    assert bare.status_code == 401


def test_official_client_chat_completions_and_streams(llama_stack: Stack) -> None:
    client = _client(llama_stack)
    reply = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=24,
    )
    assert reply.model == MODEL and reply.usage is not None and reply.usage.completion_tokens > 0
    assert reply.choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=16,
            stream=True,
        )
    )
    assert len(chunks) > 3
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # the gateway asked the tier for usage; the client, who did not, gets none
    assert all(c.usage is None for c in chunks)
    completion = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert completion.choices[0].text and completion.usage is not None


def test_every_tier_was_checked_in_the_engine_and_routes_follow_the_measurements(
    llama_stack: Stack,
) -> None:
    tiers = _tiers(llama_stack)
    for name in ("int8", "int4"):
        assert f"tier {name} (native)" in str(tiers[name]["admission"]), tiers[name]
    log = llama_stack.log_text()
    assert "up: tier int4 speed: TTFT" in log and "up: route tolerant ->" in log
    # routes come from the measured figures: whatever they chose, a tolerant prompt's chain
    # starts with the cheapest tier admitted for it, and a code prompt's with one admitted
    # for code (its agreement above the class floor)
    tolerant, code = route_chain(llama_stack, TOLERANT), route_chain(llama_stack, CODE)
    policy = httpx.get(f"{llama_stack.gateway_url}/admin/policy", headers=ADMIN, timeout=10)
    derived = policy.json()["derived_routes"]
    assert tolerant[0] == derived["tolerant"]["chain"][0], derived["tolerant"]
    assert code[0] == derived["code"]["chain"][0], derived["code"]


def test_a_prompt_past_the_tiers_length_is_refused_by_the_gateway(llama_stack: Stack) -> None:
    long_prompt = "word " * 3000  # more tokens than any tier's 2048
    body = {"model": MODEL, "messages": [{"role": "user", "content": long_prompt}]}
    answer = httpx.post(f"{llama_stack.gateway_url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "context_length_exceeded"


def test_metrics_are_read_from_llama_server(llama_stack: Stack) -> None:
    client = _client(llama_stack)
    client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4)  # type: ignore[arg-type]
    tiers = _tiers(llama_stack)
    for name in ("fp16", "int8", "int4"):
        assert tiers[name]["scrape_error"] is None, tiers[name]
        assert tiers[name]["requests_waiting"] == 0.0, tiers[name]  # scraped, not unknown
        assert tiers[name]["requests_running"] is not None
        # llama.cpp has no KV-usage gauge: unknown, not a reassuring zero
        assert tiers[name]["kv_cache_usage"] is None, tiers[name]


def test_each_tier_resets_by_erasing_its_slots(llama_stack: Stack) -> None:
    for tier in ("fp16", "int8", "int4"):
        record = reset_now(llama_stack.gateway_url, tier, ADMIN_KEY, timeout=180)
        assert record["outcome"] == "ok", record
        assert "slot_erase" in str(record["detail"]), record


@pytest.mark.slow
def test_a_tier_killed_mid_stream_is_continued_on_the_next_and_comes_back(
    llama_stack: Stack,
) -> None:
    """llama-server continues a last assistant message (assistant prefill): the answer goes
    on on the next tier with nothing repeated, one stream, the whole length asked for."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": TOLERANT}],
        "max_tokens": 300,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    lines: list[str] = []
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST", f"{llama_stack.gateway_url}/v1/chat/completions", json=body
        ) as answer,
    ):
        tier = answer.headers["x-route-tier"]
        stream = answer.iter_lines()
        for line in stream:
            lines.append(line)
            if sum(1 for seen in lines if '"content"' in seen) >= 5:
                break
        llama_stack.tier_process(tier).kill()
        lines += list(stream)
    events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert not [e for e in events if '"error"' in e], events[-3:]
    payloads = [json.loads(e) for e in events[:-1]]
    assert len({p["id"] for p in payloads}) == 1
    comments = [line for line in lines if line.startswith(": answer continued on tier")]
    assert comments and comments[0].endswith(f"after tier {tier} failed"), lines[:3]
    (usage,) = [p["usage"] for p in payloads if p.get("usage")]
    assert usage["completion_tokens"] == 300, usage
    wait_tier_back(llama_stack, tier)


@pytest.mark.slow
def test_a_looping_llama_tier_is_cut_and_continued_without_repeating_itself(
    llama_stack: Stack,
) -> None:
    chain = route_chain(llama_stack, TOLERANT)
    assert len(chain) >= 2, chain
    watched = chain[0]
    tokenizer = Tokenizer.from_file(str(llama_stack.variants / "fp16" / "tokenizer.json"))
    token = tokenizer.encode(" Paris", add_special_tokens=False).ids[0]
    unit = tokenizer.decode([token])
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": TOLERANT}],
        "max_tokens": 48,
        "temperature": 0,
        "logit_bias": {str(token): 100},
        "stream": True,
    }
    original = llama_stack.policy.read_text()
    assert SHIPPED_ESCALATION in original
    watching = original.replace(SHIPPED_ESCALATION, f"escalation:\n  tiers: [{watched}]\n")
    try:
        if watching != original:  # the shipped policy watches int4 already
            apply_policy(llama_stack, watching)
        with httpx.stream(
            "POST", f"{llama_stack.gateway_url}/v1/chat/completions", json=body, timeout=120
        ) as answer:
            assert answer.status_code == 200
            lines = [line for line in answer.iter_lines() if line]
    finally:
        if watching != original:
            apply_policy(llama_stack, original)
    comments = [i for i, line in enumerate(lines) if line.startswith(": answer continued")]
    assert len(comments) == 1, lines
    assert lines[comments[0]].endswith(f"after tier {watched} degenerated (loop)")
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    texts = [c["delta"].get("content") or "" for e in events for c in e["choices"]]
    # the client got the loop's first occurrence from the watched tier, then the next tier
    # went on from there (its prefill continued, not repeated from the start)
    assert "".join(texts).startswith(unit * 2)
    assert lines[-1] == "data: [DONE]"


def test_the_tier_key_is_required_and_the_gateway_sends_it(llama_stack: Stack) -> None:
    url = llama_stack.tier_urls["int8"]
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).status_code == 401
    key = {"Authorization": f"Bearer {os.environ.get('MO_TIER_API_KEY', 'integration-tier-key')}"}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, headers=key, timeout=30)
    assert answer.status_code == 200, answer.text
