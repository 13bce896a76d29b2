"""A tier killed mid-stream is restarted, and the restarted process is the one that answers.

test_faults.py shows the stream ends cleanly and the gateway answers again; this test shows
the answer after the restart comes from the killed tier's new process: the route names the
same tier, that tier's port is served by a new pid, and the new process's own request counter
(vLLM's metrics start from zero in a new process) counts the gateway's requests.
"""

from __future__ import annotations

import time

import httpx
import psutil
import pytest

from tests.integration.conftest import ADMIN_KEY, Stack

pytestmark = pytest.mark.integration
MODEL = "SmolLM2-135M-Instruct"
CHAT = [{"role": "user", "content": "Hi! How are you doing today?"}]
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
RESTART_TIMEOUT = 300.0


def _successes(stack: Stack, tier: str) -> float:
    """The tier's ``vllm:request_success_total``, summed over its labels."""
    text = httpx.get(f"{stack.tier_urls[tier]}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )


def _status(process: psutil.Process) -> str:
    try:
        return str(process.status())
    except psutil.NoSuchProcess:
        return "gone"


def _state(stack: Stack, tier: str) -> str:
    tiers = httpx.get(f"{stack.gateway_url}/admin/tiers", headers=ADMIN, timeout=10).json()
    return str(tiers["tiers"][tier]["state"])


def _restarted(stack: Stack, tier: str, victim: int) -> psutil.Process:
    """The tier's new server process, once it serves and the gateway routes to it again."""
    deadline = time.monotonic() + RESTART_TIMEOUT
    while time.monotonic() < deadline:
        try:
            process = stack.tier_process(tier)
            healthy = httpx.get(f"{stack.tier_urls[tier]}/health", timeout=2).status_code == 200
        except (AssertionError, httpx.HTTPError, psutil.Error):
            healthy = False
        if healthy and process.pid != victim and _state(stack, tier) == "ready":
            return process
        time.sleep(2)
    pytest.fail(f"tier {tier} was not restarted:\n{stack.log_text()[-3000:]}")


@pytest.mark.slow
def test_the_restarted_tier_is_the_one_answering(stack: Stack) -> None:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 400, "ignore_eos": True}
    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "POST", f"{stack.gateway_url}/v1/chat/completions", json={**body, "stream": True}
        ) as answer,
    ):
        tier = answer.headers["x-route-tier"]
        lines = answer.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        victim = stack.tier_process(tier)
        victim.kill()
        tail = [line for line in lines if line.startswith("data: ")]  # ends, does not hang
    assert tail[-1] == "data: [DONE]"
    # Gone (or a zombie until the supervisor reaps it: is_running() is True for those).
    deadline = time.monotonic() + 30
    while victim.is_running() and _status(victim) != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the killed tier process is still running"
        time.sleep(0.2)

    restarted = _restarted(stack, tier, victim.pid)
    before = _successes(stack, tier)
    asked = 3
    for _ in range(asked):
        reply = httpx.post(
            f"{stack.gateway_url}/v1/chat/completions",
            json={"model": MODEL, "messages": CHAT, "max_tokens": 4},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
        # The same class routes to the same first choice as before the kill: that tier.
        assert reply.headers["x-route-tier"] == tier, reply.headers.get("x-route-reason")
    assert _successes(stack, tier) - before >= asked
    assert stack.tier_process(tier).pid == restarted.pid  # the new process, still the same one
