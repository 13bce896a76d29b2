"""The supervised tiers of the session stack: three variants, restart after a crash, reset."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest

from backends.client import ResetResult, TierClient
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration
MODEL = "SmolLM2-135M-Instruct"


def _chat(url: str, text: str, max_tokens: int = 20) -> str:
    reply = httpx.post(
        f"{url}/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "temperature": 0,
        },
        timeout=120,
    )
    reply.raise_for_status()
    return str(reply.json()["choices"][0]["message"]["content"])


def test_all_three_tiers_serve_their_variant(stack: Stack) -> None:
    assert set(stack.tier_urls) == {"fp16", "int8", "int4"}
    for name, url in stack.tier_urls.items():
        text = _chat(url, "What is the capital of France?")
        assert text.strip(), name
        if name != "int4":  # 4-bit SmolLM2-135M may word it differently
            assert "Paris" in text, (name, text)
        # Each tier loaded its own variant folder.
        models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert models[0]["id"] == MODEL
        assert models[0]["root"].rstrip("/").endswith(f"/{name}")


def test_killed_tier_is_restarted_by_the_supervisor(stack: Stack) -> None:
    victim = stack.tier_process("int8")
    victim.kill()
    victim.wait(timeout=30)
    url = stack.tier_urls["int8"]
    deadline = time.monotonic() + 300
    healthy = False
    while time.monotonic() < deadline and not healthy:
        time.sleep(2)
        with contextlib.suppress(httpx.HTTPError):
            healthy = httpx.get(f"{url}/health", timeout=2).status_code == 200
    assert healthy, stack.log_text()[-3000:]
    assert stack.tier_process("int8").pid != victim.pid
    assert "Paris" in _chat(url, "What is the capital of France?")


def test_reset_empties_the_prefix_cache(stack: Stack) -> None:
    """The reset primitive, verified through /metrics: a probe of one full KV block hits the
    prefix cache before the reset and misses after it (vLLM has no "cache empty" gauge)."""

    async def reset() -> ResetResult:
        async with httpx.AsyncClient(trust_env=False) as client:
            tier = TierClient(stack.tier_urls["fp16"], client, model=MODEL)
            before = await tier.metrics()
            result = await tier.reset_kv_pool(verify=True)
            after = await tier.metrics()
        assert after.prefix_cache_queries > before.prefix_cache_queries
        return result

    result = asyncio.run(reset())
    assert result.method == "reset_prefix_cache"  # sleep mode does not exist on CPU
    assert result.verified, result.detail
