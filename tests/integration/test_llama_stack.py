"""The llama.cpp stack (``up --engine llama.cpp``, what ``up`` serves on a CPU-only host): the
official client through the gateway to llama-server tiers, routes derived from what was
measured in the engine, length limits, KV resets by slot erase, a tier killed mid-stream, a
looping tier escalated, supervision."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import yaml
from tokenizers import Tokenizer

from model_optimizer.soak import reset_now
from tests.integration.conftest import (
    ADMIN,
    ADMIN_KEY,
    MODEL,
    TIER_KEY,
    Stack,
    apply_policy,
    gateway_config,
    gateway_processes,
    pooled,
    route_chain,
    second_server,
    start_stack,
    wait_tier_back,
    wait_until,
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
    key = {"Authorization": f"Bearer {TIER_KEY}"}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, headers=key, timeout=30)
    assert answer.status_code == 200, answer.text


def test_a_gguf_that_does_not_load_stops_up_with_one_line_and_no_tier_left(
    llama_stack: Stack, tmp_path: Path
) -> None:
    """``up`` on variants whose int8 file is cut short: llama-server exits at start; ``up``
    says which tier and why in one line, exits 1, and the tier started before it is stopped."""
    for tier in ("fp16", "int8"):
        shutil.copytree(llama_stack.variants / tier, tmp_path / "variants" / tier)
    broken = tmp_path / "variants" / "int8" / "model.gguf"
    with broken.open("r+b") as fh:
        fh.truncate(broken.stat().st_size // 3)
    started = time.monotonic()
    with pytest.raises(BaseException) as info:  # start_stack fails the test: caught here
        start_stack(
            tmp_path / "up.log",
            ("fp16", "int8"),
            ("--variants", str(tmp_path / "variants")),
            engine="llama.cpp",
        )
    assert "exited with 1" in str(info.value)
    assert time.monotonic() - started < 120
    log = (tmp_path / "up.log").read_text()
    errors = [line for line in log.splitlines() if line.startswith("model-optimizer: error:")]
    assert len(errors) == 1 and "tier int8 exited during start" in errors[0], log[-2000:]
    assert "up: stopping tiers" in log
    leftovers = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and str(tmp_path) in " ".join(p.info["cmdline"])
    ]
    assert leftovers == []


def test_shadow_comparisons_run_against_the_llama_reference(
    llama_stack: Stack, tmp_path: Path
) -> None:
    """A whole answer from int4 is compared with fp16's greedy copy off the path; the
    per-tier signals llama.cpp has are exported, the ones it lacks are left out."""
    from tests.integration.test_monitoring import chat, compared_so_far, read, value

    policy = yaml.safe_load(llama_stack.policy.read_text())
    policy["shadow"].update(fraction=1.0, max_concurrent=1, max_tokens=32)
    policy["pinning"]["allow"] = True
    (tmp_path / "routing.yaml").write_text(yaml.safe_dump(policy))
    config = gateway_config(
        llama_stack, policy_path=str(tmp_path / "routing.yaml"), metrics_interval=0.5
    )
    with gateway_processes(config, tmp_path, 1) as [(url, _)]:
        chat(url, "Name three primary colors.", 32)
        wait_until(lambda: compared_so_far(url) >= 1.0, 120)
        values = read(url)
        assert value(values, "gateway_shadow_agreement_count", tier="int4") == 1.0
        total = value(values, "gateway_shadow_agreement_sum", tier="int4")
        assert total is not None and 0.0 <= total <= 1.0
        memory = value(values, "gateway_tier_memory_bytes", tier="int4")
        assert memory is not None and memory > 50 * 2**20  # the model and its slots
        # llama.cpp exports no KV-usage gauge: the gateway does not make one up
        assert value(values, "gateway_tier_kv_usage_ratio", tier="int4") is None


def _predicted(url: str) -> float:
    """Tokens this llama-server generated (its own counter)."""
    headers = {"Authorization": f"Bearer {TIER_KEY}"}
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llamacpp:tokens_predicted_total")
    )


def test_a_llama_cpp_tier_pool_serves_from_both_replicas(
    llama_stack: Stack, tmp_path: Path
) -> None:
    """int4 as a pool of two llama-servers (the stack's and a replica started with its command
    line): load through the gateway reaches both."""
    with second_server(llama_stack, "int4", tmp_path, timeout=60) as replica:
        policy = yaml.safe_load(llama_stack.policy.read_text())
        policy["pinning"]["allow"] = True
        policy["resets"]["enabled"] = False
        (tmp_path / "routing.yaml").write_text(yaml.safe_dump(policy))
        config = gateway_config(
            llama_stack,
            policy_path=str(tmp_path / "routing.yaml"),
            redis_url="redis://127.0.0.1:6379/3",
            redis_prefix=f"mo:test:{uuid.uuid4().hex[:8]}",
            metrics_interval=0.5,
        )
        pool = [llama_stack.tier_urls["int4"], replica]
        config = pooled(config, "int4", pool)
        before = {url: _predicted(url) for url in pool}
        with gateway_processes(config, tmp_path, 1) as [(url, _)]:
            body = {"model": MODEL, "messages": QUESTION, "max_tokens": 24, "ignore_eos": True}

            def ask(_: int) -> tuple[int, str]:
                answer = httpx.post(
                    f"{url}/v1/chat/completions",
                    json=body,
                    headers={"x-route-tier": "int4"},
                    timeout=120,
                )
                return answer.status_code, answer.headers.get("x-route-endpoint", "")

            with ThreadPoolExecutor(4) as clients:
                results = list(clients.map(ask, range(12)))
        assert [status for status, _ in results] == [200] * 12, results
        assert len({endpoint for _, endpoint in results}) == 2, results
        served = {u: _predicted(u) - before[u] for u in pool}
        assert all(tokens >= 24 for tokens in served.values()), served
