"""The gateway's routing on the real stack: classes, tiers, limits, policy reloads, metrics."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from backends.metrics import parse_metrics
from tests.integration.conftest import ADMIN_KEY, Stack

pytestmark = pytest.mark.integration
MODEL = "SmolLM2-135M-Instruct"
CODE = "Write a Python function that reverses a linked list."
CHAT = "Hi! How are you doing today?"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _client(stack: Stack) -> openai.OpenAI:
    # The admin key: the policy tells only admins the x-route-reason (errors.detail: minimal).
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=ADMIN_KEY, timeout=120)


def _ask(stack: Stack, text: str, max_tokens: int = 8) -> Any:
    return _client(stack).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": text}],
        temperature=0,
        max_tokens=max_tokens,
    )


def _policy(stack: Stack) -> dict[str, Any]:
    return dict(httpx.get(f"{stack.gateway_url}/admin/policy", headers=ADMIN, timeout=10).json())


def _head(stack: Stack, cls: str) -> str:
    """The first tier of the class's chain as the gateway serves it (derived from this
    machine's measurements where the policy says `derive`)."""
    return str(_policy(stack)["policy"]["routes"][cls]["tiers"][0])


def test_routes_are_derived_from_this_machines_measurements(stack: Stack) -> None:
    """up measured every tier (admission check + speed); the shipped policy's derived routes
    keep only tiers at or above each class's floor, the reference (fp16) last."""
    status = _policy(stack)
    derived = status["derived_routes"]
    assert set(derived) == {"tolerant", "code", "math", "long"}
    floors = {"tolerant": 0.6, "code": 0.9, "math": 0.9, "long": 0.6}
    for cls, entry in derived.items():
        chain = entry["chain"]
        assert chain and chain[-1] == "fp16", entry
        assert status["policy"]["routes"][cls]["tiers"] == chain + entry["overflow"]
        for name in chain[:-1]:
            agreement = float(entry["reasons"][name].split()[1].rstrip(","))
            assert agreement >= floors[cls], entry
        for name, why in entry["reasons"].items():
            assert name in chain or any(w in why for w in ("floor", "dominated", "not admitted"))
    assert "route tolerant -> " in stack.log_text()  # up printed them


def test_code_question_lands_on_the_head_of_its_chain(stack: Stack) -> None:
    raw = _ask(stack, CODE)
    assert raw.headers["x-route-class"] == "code"
    assert raw.headers["x-route-tier"] == _head(stack, "code")
    assert "code" in raw.headers["x-route-reason"]
    assert raw.parse().choices[0].message.content


def test_chit_chat_lands_on_the_head_of_its_chain(stack: Stack) -> None:
    raw = _ask(stack, CHAT)
    assert raw.headers["x-route-class"] == "tolerant"
    assert raw.headers["x-route-tier"] == _head(stack, "tolerant")
    assert raw.parse().usage.completion_tokens > 0


def test_math_question_lands_on_the_head_of_its_chain(stack: Stack) -> None:
    raw = _ask(stack, "Solve for x: 3x + 2 = 11. How many solutions are there?")
    assert raw.headers["x-route-class"] == "math"
    assert raw.headers["x-route-tier"] == _head(stack, "math")


def test_streamed_answer_carries_route_headers(stack: Stack) -> None:
    client = _client(stack)
    with client.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": CHAT}],
        temperature=0,
        max_tokens=8,
        stream=True,
    ) as response:
        assert response.headers["x-route-tier"] == _head(stack, "tolerant")
        chunks = list(response.parse())
    assert len(chunks) > 2
    assert any(chunk.choices and chunk.choices[0].delta.content for chunk in chunks)


def test_over_long_prompt_is_refused_with_context_length_exceeded(stack: Stack) -> None:
    words = " ".join(["tell me about the weather again"] * 400)  # ~2,400 tokens > 1,536
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(stack, words)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "context_length_exceeded"
    assert error["param"] == "messages"
    assert "1536" in error["message"]
    assert caught.value.response.headers["x-route-class"] in {"tolerant", "long"}


def test_oversized_max_tokens_is_clamped_to_the_tier(stack: Stack) -> None:
    raw = _ask(stack, CHAT, max_tokens=100_000)
    assert raw.status_code == 200
    assert "lowered to" in raw.headers["x-route-reason"]


def test_gateway_metrics_count_requests_by_class_and_tier(stack: Stack) -> None:
    tier = _ask(stack, CODE).headers["x-route-tier"]
    text = httpx.get(f"{stack.gateway_url}/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith("gateway_requests_total{")]
    assert any('class="code"' in line and f'tier="{tier}"' in line for line in lines), lines
    assert "gateway_time_to_first_token_seconds" in text


def test_policy_edit_takes_effect_without_restart(stack: Stack) -> None:
    original = stack.policy.read_text()
    admin = f"{stack.gateway_url}/admin/policy"
    before = httpx.get(admin, headers=ADMIN, timeout=10).json()
    head = _head(stack, "tolerant")
    tiers = httpx.get(f"{stack.gateway_url}/admin/tiers", headers=ADMIN, timeout=10).json()
    other = next(
        name
        for name, entry in tiers["tiers"].items()
        if name != head and (entry["classes"] is None or "tolerant" in entry["classes"])
    )
    try:
        # A bad edit is refused: the last good policy keeps serving, the error is shown.
        stack.policy.write_text(original.replace("tiers: [fp16, int8, int4]", "tiers: [fp16, nope"))
        shown = _wait_for(lambda: httpx.get(admin, headers=ADMIN, timeout=10).json(), "last_error")
        assert "routing.yaml" in shown["last_error"]
        assert shown["digest"] == before["digest"]
        assert _ask(stack, CHAT).headers["x-route-tier"] == head

        # A good edit is applied: chit-chat now goes to the one tier the edit names.
        written = "tolerant: {tiers: [int4, int8, fp16], derive: {floor: 0.6, minimise: latency}}"
        edited = original.replace(written, f"tolerant: [{other}]")
        assert edited != original
        stack.policy.write_text(edited)
        applied = _wait_for(
            lambda: httpx.get(admin, headers=ADMIN, timeout=10).json(),
            "digest",
            lambda status: status["digest"] != before["digest"] and not status["last_error"],
        )
        assert applied["policy"]["routes"]["tolerant"]["tiers"] == [other]
        assert _ask(stack, CHAT).headers["x-route-tier"] == other
    finally:
        stack.policy.write_text(original)
        _wait_for(
            lambda: httpx.get(admin, headers=ADMIN, timeout=10).json(),
            "digest",
            lambda status: status["digest"] == before["digest"] and not status["last_error"],
        )
    assert _ask(stack, CHAT).headers["x-route-tier"] == head


def test_admin_needs_the_admin_key(stack: Stack) -> None:
    response = httpx.get(f"{stack.gateway_url}/admin/policy", timeout=10)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    tiers = httpx.get(f"{stack.gateway_url}/admin/tiers", headers=ADMIN, timeout=10).json()
    assert tiers["shared_state"] is True  # the machine's Redis is in use
    assert {name: entry["state"] for name, entry in tiers["tiers"].items()} == {
        "fp16": "ready",
        "int8": "ready",
        "int4": "ready",
    }


def test_client_leaving_mid_stream_cancels_the_generation(stack: Stack) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": CHAT}],
        "max_tokens": 1500,
        "stream": True,
        "ignore_eos": True,
    }
    tier = _head(stack, "tolerant")
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{stack.gateway_url}/v1/chat/completions", json=body) as answer,
    ):
        assert answer.headers["x-route-tier"] == tier
        lines = answer.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        deadline = time.monotonic() + 10
        while _running(stack, tier) != 1:  # the gauge follows the engine's steps
            assert time.monotonic() < deadline, "vLLM does not show the request running"
            time.sleep(0.2)
    # The client is gone; the gateway closed its upstream request, so vLLM aborted it.
    deadline = time.monotonic() + 20
    while _running(stack, tier) != 0:
        assert time.monotonic() < deadline, "vLLM still runs the abandoned request"
        time.sleep(0.5)


def _running(stack: Stack, tier: str) -> float:
    text = httpx.get(f"{stack.tier_urls[tier]}/metrics", timeout=10).text
    return parse_metrics(text, MODEL).requests_running


def _wait_for(read: Any, key: str, done: Any = None, timeout: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if (done(value) if done else value.get(key)) or time.monotonic() > deadline:
            assert done(value) if done else value.get(key), value
            return dict(value)
        time.sleep(0.3)
