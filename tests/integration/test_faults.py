"""Faults on the real stack: a tier killed mid-stream, Redis gone under load, bad policy edits."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backends.metrics import parse_metrics
from backends.process import free_port
from gateway.config import hash_key
from tests.integration.conftest import (
    ADMIN,
    Stack,
    apply_policy,
    gateway_config,
    gateway_processes,
    route_chain,
    wait_tier_back,
    wait_until,
)
from tests.redis_server import start_redis

pytestmark = pytest.mark.integration
MODEL = "SmolLM2-135M-Instruct"
CHAT = [{"role": "user", "content": "Hi! How are you doing today?"}]


def _ask(url: str, max_tokens: int = 2) -> int:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": max_tokens}
    try:
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).status_code
    except httpx.HTTPError:
        return -1


@pytest.mark.slow
def test_a_tier_killed_mid_stream_is_continued_on_the_next_and_comes_back(stack: Stack) -> None:
    """The client's answer goes on on the next tier of its chain from where it stopped: one
    stream, no error event, the whole length asked for (gateway/request/stream/resume.py)."""
    body = {
        "model": MODEL,
        "messages": CHAT,
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    lines: list[str] = []
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{stack.gateway_url}/v1/chat/completions", json=body) as answer,
    ):
        tier = answer.headers["x-route-tier"]
        stream = answer.iter_lines()
        for line in stream:  # a few tokens first, then the tier dies under the stream
            lines.append(line)
            if sum(1 for seen in lines if '"content"' in seen) >= 5:
                break
        stack.tier_process(tier).kill()
        lines += list(stream)  # must end, not hang
    events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert not [e for e in events if '"error"' in e], events[-3:]
    payloads = [json.loads(e) for e in events[:-1]]
    assert len({p["id"] for p in payloads}) == 1  # one answer
    comments = [line for line in lines if line.startswith(": answer continued on tier")]
    assert comments and comments[0].endswith(f"after tier {tier} failed"), lines[:3]
    # A watched tier that took it over may loop on this 400-token answer: escalated on.
    assert all("degenerated" in comment for comment in comments[1:]), comments
    (usage,) = [p["usage"] for p in payloads if p.get("usage")]
    assert usage["completion_tokens"] == 400, usage  # the length asked for, across both tiers
    finish = [c["finish_reason"] for p in payloads for c in p["choices"] if c["finish_reason"]]
    assert finish == ["length"]
    metrics = httpx.get(f"{stack.gateway_url}/metrics", timeout=10).text
    assert f'gateway_stream_resumes_total{{from_tier="{tier}"' in metrics
    wait_tier_back(stack, tier)
    assert _ask(stack.gateway_url) == 200


WHOLE_REGENERATE = "failover:\n  whole_answers: regenerate\n"
ESCALATING = "escalation:\n  tiers: [int4]\n"


@pytest.mark.slow
def test_a_tier_killed_under_a_whole_answer_is_continued_on_the_next(stack: Stack) -> None:
    """With ``failover.whole_answers: continue`` a whole answer is asked as a stream and
    assembled: its tier SIGKILLed midway, the answer goes on on the next tier and the client
    gets one whole answer of the length asked for (gateway/request/completions/whole.py)."""
    chain = route_chain(stack, CHAT[0]["content"])
    assert len(chain) >= 2, f"the route has one tier on this machine: {chain}"
    tier, others = chain[0], chain[1:]
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 400, "ignore_eos": True}
    original = stack.policy.read_text()
    assert WHOLE_REGENERATE in original
    continuing = original.replace(WHOLE_REGENERATE, "failover:\n  whole_answers: continue\n")
    # Nothing escalated: every token the other tiers generate is the answer's.
    continuing = continuing.replace(ESCALATING, "escalation:\n  tiers: []\n")
    assert ESCALATING in original
    answers: list[httpx.Response] = []

    def ask() -> None:
        url = f"{stack.gateway_url}/v1/chat/completions"
        answers.append(httpx.post(url, json=body, timeout=300))

    try:
        apply_policy(stack, continuing)
        before = _generated(stack, tier)
        others_before = sum(_generated(stack, other) for other in others)
        asking = threading.Thread(target=ask)
        asking.start()
        wait_until(lambda: _generated(stack, tier) >= before + 10, timeout=120)
        stack.tier_process(tier).kill()  # a whole answer's tier has sent the client nothing yet
        asking.join(timeout=300)
    finally:
        apply_policy(stack, original)
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-route-tier"] == tier
    continued = answer.headers["x-route-continued"].split(",")
    assert tier not in continued
    whole = answer.json()
    assert whole["object"] == "chat.completion"
    assert whole["usage"]["completion_tokens"] == 400, whole["usage"]
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["choices"][0]["message"]["content"]
    # Continued, not generated again: the other tiers generated less than the whole length.
    assert sum(_generated(stack, other) for other in others) - others_before < 400
    metrics = httpx.get(f"{stack.gateway_url}/metrics", timeout=10).text
    resumed = f'gateway_stream_resumes_total{{from_tier="{tier}",to_tier="{continued[0]}"}}'
    assert resumed in metrics
    wait_tier_back(stack, tier)
    assert _ask(stack.gateway_url) == 200


def _generated(stack: Stack, tier: str) -> float:
    """Tokens ``tier`` generated so far (vLLM's own counter)."""
    text = httpx.get(f"{stack.tier_urls[tier]}/metrics", timeout=10).text
    return parse_metrics(text).generation_tokens


def test_bad_policy_files_never_replace_the_serving_one(stack: Stack) -> None:
    original = stack.policy.read_text()
    admin = f"{stack.gateway_url}/admin/policy"
    digest = httpx.get(admin, headers=ADMIN, timeout=10).json()["digest"]
    bad = {
        "garbage": "tiers: [fp16\n  - ]]: ::\n",
        "empty": "",
        "unknown tier": original.replace(
            "tiers: [int4, int8, fp16], derive", "tiers: [int2], derive"
        ),
    }
    try:
        for what, text in bad.items():
            stack.policy.write_text(text)
            deadline = time.monotonic() + 15
            status = httpx.get(admin, headers=ADMIN, timeout=10).json()
            while not status["last_error"] and time.monotonic() < deadline:
                time.sleep(0.3)
                status = httpx.get(admin, headers=ADMIN, timeout=10).json()
            assert status["last_error"], what
            assert status["digest"] == digest, what
            assert _ask(stack.gateway_url) == 200, what
    finally:
        stack.policy.write_text(original)
    deadline = time.monotonic() + 15
    while httpx.get(admin, headers=ADMIN, timeout=10).json()["last_error"]:
        assert time.monotonic() < deadline, "the restored policy still shows an error"
        time.sleep(0.3)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[int, list[subprocess.Popen[bytes]]]]:
    """A throwaway redis-server on a free loopback port (restartable by the test)."""
    port = free_port()
    servers = [start_redis(port, tmp_path)]
    try:
        yield port, servers
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()
            server.wait(timeout=10)


def test_redis_gone_under_load_then_back(
    stack: Stack, own_redis: tuple[int, list[subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    port, servers = own_redis
    key = "fault-admin-key"
    config = gateway_config(
        stack,
        redis_url=f"redis://127.0.0.1:{port}/0",
        redis_prefix=f"mo:test:{uuid.uuid4().hex[:8]}",
        admin_key_hashes=[hash_key(key)],
        metrics_interval=1.0,
    )
    statuses: list[int] = []
    stop = threading.Event()
    with gateway_processes(config, tmp_path, 1) as running:
        url = running[0][0]

        def load() -> None:
            for _ in range(500):  # bounded
                if stop.is_set():
                    return
                statuses.append(_ask(url))

        def shared() -> bool:
            answer = httpx.get(f"{url}/admin/tiers", headers={"Authorization": f"Bearer {key}"})
            return bool(answer.json()["shared_state"])

        worker = threading.Thread(target=load)
        try:
            assert shared()
            worker.start()
            wait_until(lambda: len(statuses) >= 3, 60)
            servers[-1].send_signal(signal.SIGKILL)
            servers[-1].wait(timeout=10)
            answered = len(statuses)
            # served without Redis
            wait_until(lambda: len(statuses) >= answered + 3 and not shared(), 60)
            servers.append(  # the same server again, on the same port
                subprocess.Popen(
                    servers[0].args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
            wait_until(shared, timeout=30)  # picked Redis back up by itself
            answered = len(statuses)
            wait_until(lambda: len(statuses) >= answered + 2, 60)
        finally:
            stop.set()
            if worker.is_alive():
                worker.join(timeout=300)
    assert statuses and all(status == 200 for status in statuses), sorted(set(statuses))
    text = (tmp_path / "gateway0.log").read_text()
    assert text.count("using local state") == 1, text[-2000:]  # logged once
