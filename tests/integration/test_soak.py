"""The short soaks: steady load through the real stack for a minute, a reset in the middle;
half a minute with the serving tier SIGKILLed."""

from __future__ import annotations

import time

import httpx
import pytest

from model_optimizer.soak import PROMPTS, render, soak
from tests.integration.conftest import ADMIN_KEY, Stack

pytestmark = pytest.mark.integration
SECONDS = 60.0  # the long version: model-optimizer soak --minutes 30
MODEL = "SmolLM2-135M-Instruct"


@pytest.mark.slow
def test_a_minute_of_load_with_a_reset_loses_nothing(stack: Stack) -> None:
    result = soak(
        stack.gateway_url,
        "SmolLM2-135M-Instruct",
        clients=3,
        seconds=SECONDS,
        gateway_pid=stack.process.pid,  # `up` runs the gateway in its own process
        reset_tier="int4",
        admin_key=ADMIN_KEY,
    )
    print(render(result))
    assert result.sent >= 20, result
    assert result.lost == 0, result.statuses
    assert result.reset_outcome == "ok", result.reset_outcome
    # Flat memory: a minute of traffic may not grow the gateway process by more than 50 MB.
    assert result.rss_end_mb - result.rss_start_mb < 50, result


@pytest.mark.slow
def test_a_tier_killed_under_streamed_load_costs_no_client_an_error(stack: Stack) -> None:
    """The serving tier of chit-chat SIGKILLed under load: whole answers go to the next tier,
    streams in the middle of an answer go on there (gateway/request/stream/resume.py); not one
    client sees an error. The tier is back (restarted by the supervisor) before the test ends."""
    probe = {"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 2}
    tier = httpx.post(f"{stack.gateway_url}/v1/chat/completions", json=probe, timeout=60).headers[
        "x-route-tier"
    ]
    victims: list[int] = []

    def kill() -> str:
        if victims:  # once: the next kill would find the tier still restarting
            raise LookupError(f"{tier} killed once already")
        process = stack.tier_process(tier)
        process.kill()
        victims.append(process.pid)
        return tier

    try:
        result = soak(stack.gateway_url, MODEL, clients=3, seconds=20.0, kill_every=5.0, kill=kill)
        print(render(result))
        assert result.kills[0] == tier, result.kills
        assert result.sent >= 10, result
        assert result.lost == 0, result.statuses
    finally:
        _wait_ready(stack, tier)


def _wait_ready(stack: Stack, tier: str) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            described = httpx.get(f"{stack.gateway_url}/admin/tiers", headers=headers, timeout=10)
            if described.json()["tiers"][tier]["state"] == "ready":
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    pytest.fail(f"tier {tier} did not come back:\n{stack.log_text()[-2000:]}")
