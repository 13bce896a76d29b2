"""The supervised tiers of the session stack: three variants, restart after a crash, reset."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx
import pytest

from backends.client import ResetResult, TierClient
from tests.integration.conftest import ADMIN_KEY, TIER_KEY, Stack, cli

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


def _admission(stack: Stack) -> dict[str, dict[str, Any]]:
    answer = httpx.get(
        f"{stack.gateway_url}/admin/tiers",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["tiers"])


def test_all_three_tiers_serve_their_variant(stack: Stack) -> None:
    """Each tier serves its own variant and was judged in the engine (it says how in
    /admin/tiers and up's log); the reference names the capital of France. A quantized tier's
    own greedy answer to that prompt is not the test: the prompt is a coin toss for this model
    (docs/backends.md#in-engine-admission-check)."""
    assert set(stack.tier_urls) == {"fp16", "int8", "int4"}
    tiers = _admission(stack)
    assert tiers["fp16"]["classes"] is None  # the reference serves everything
    for name in ("int8", "int4"):
        assert tiers[name]["admission"].startswith(f"tier {name} ("), tiers[name]
        assert f"up: tier {name} (" in stack.log_text()
    for name, url in stack.tier_urls.items():
        text = _chat(url, "What is the capital of France?")
        assert text.strip(), name
        classes = tiers[name]["classes"]
        if name == "fp16":
            assert "Paris" in text, text
        elif classes is not None and "tolerant" not in classes:
            assert "kept out of chat" in tiers[name]["admission"], tiers[name]
        # Each tier loaded its own variant folder (or its emulated copy).
        models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert models[0]["id"] == MODEL
        assert models[0]["root"].rstrip("/").endswith(f"/{name}")


@pytest.mark.slow
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
    # The supervisor restarts the tier as the admission check left it (native or emulated).
    assert _chat(url, "What is the capital of France?").strip()
    models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    assert models[0]["root"].rstrip("/").endswith("/int8")


def test_reset_empties_the_prefix_cache(stack: Stack) -> None:
    """The reset primitive, verified through /metrics: a probe of one full KV block hits the
    prefix cache before the reset and misses after it (vLLM has no "cache empty" gauge)."""

    async def reset() -> ResetResult:
        async with httpx.AsyncClient(trust_env=False) as client:
            tier = TierClient(stack.tier_urls["fp16"], client, model=MODEL, api_key=TIER_KEY)
            before = await tier.metrics()
            result = await tier.reset_kv_pool(verify=True)
            after = await tier.metrics()
        assert after.prefix_cache_queries > before.prefix_cache_queries
        return result

    result = asyncio.run(reset())
    assert result.method == "reset_prefix_cache"  # sleep mode does not exist on CPU
    assert result.verified, result.detail


def test_the_dev_routes_need_the_tier_key(stack: Stack) -> None:
    """vLLM's dev mode serves /collective_rpc, /pause, /sleep ... with no key of its own; the
    tier guard (backends/tier_guard.py) answers 401 there without the tier's key, while
    /health and the OpenAI API stay open on loopback."""
    url = stack.tier_urls["int4"]
    for path in ("/collective_rpc", "/reset_prefix_cache", "/pause", "/server_info"):
        method = "GET" if path == "/server_info" else "POST"
        assert httpx.request(method, f"{url}{path}", timeout=10).status_code == 401, path
        wrong = {"Authorization": "Bearer wrong"}
        assert httpx.request(method, f"{url}{path}", headers=wrong, timeout=10).status_code == 401
    keyed = {"Authorization": f"Bearer {TIER_KEY}"}
    info = httpx.get(f"{url}/server_info", headers=keyed, timeout=30)
    assert info.status_code == 200, info.text
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 200


@pytest.mark.slow
def test_check_serving_judges_the_running_tiers_as_up_did(stack: Stack) -> None:
    """``model-optimizer check --serving`` on the session stack's tiers: one verdict line per
    tier, the same admitted/kept-out as up's own check, exit 0 only when all passed."""
    base = stack.tier_urls["fp16"]
    done = cli("check", "--serving", "--tier-base", base, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("check: tier ")]
    assert len(lines) == 2, (done.stdout, done.stderr)
    tiers = _admission(stack)
    for name in ("int8", "int4"):
        (line,) = [x for x in lines if x.startswith(f"check: tier {name} (")]
        assert ("admitted" in line) == ("admitted" in tiers[name]["admission"]), (line, tiers)
    assert done.returncode == (0 if all("admitted" in x for x in lines) else 1), done.stderr
