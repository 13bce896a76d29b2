"""A tier as a pool of two real vLLM replicas behind two gateway processes sharing Redis.

The second replica of int4 is the stack's own int4 server started again on another loopback
port (the same argv and environment, so the same weights, flags and tier key). Two
``python -m gateway`` processes route over ``int4: endpoints [stack's, replica]``; without
measurements the shipped policy's tolerant route starts with int4, so chat lands on the pool.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from backends.process import free_port
from gateway.config import TierEndpoint, hash_key
from tests.integration.conftest import (
    TIER_KEY,
    Stack,
    gateway_config,
    gateway_processes,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "SmolLM2-135M-Instruct"
# One key per test: the per-key rate limit (LIMIT a minute, a sliding window shared through
# Redis) then starts empty in each.
KEYS = {"load": "pool-load-key", "limit": "pool-limit-key", "kill": "pool-kill-key"}
LIMIT = 40
CHAT = [{"role": "user", "content": "Hi! How are you doing today?"}]


def _served(url: str) -> float:
    """Requests this vLLM server finished (its own counter, every finish reason)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )


@pytest.fixture(scope="module")
def replica(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    original = stack.tier_process("int4")
    argv, env = original.cmdline(), original.environ()
    port = free_port()
    argv[argv.index("--port") + 1] = str(port)
    log = tmp_path_factory.mktemp("replica") / "int4-replica.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the replica was not healthy in 300 s"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def gateways(
    stack: Stack, replica: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[list[str], list[str]]]:
    """Two gateway processes; yields their URLs and the int4 pool's endpoints."""
    config = gateway_config(
        stack,
        redis_url="redis://127.0.0.1:6379/0",
        redis_prefix=f"mo:test:{uuid.uuid4().hex[:8]}",
        api_key_hashes=[hash_key(key) for key in KEYS.values()],
        rate_limit_per_minute=LIMIT,
        metrics_interval=0.5,
    )
    pool = [stack.tier_urls["int4"], replica]
    tiers = [
        TierEndpoint.model_validate(
            {"name": "int4", "endpoints": pool, "max_model_len": 2048, "api_key": TIER_KEY}
        )
        if tier.name == "int4"
        else tier
        for tier in config.tiers
    ]
    config = config.model_copy(update={"tiers": tiers})
    with gateway_processes(config, tmp_path_factory.mktemp("pool-gateways"), 2) as running:
        yield [url for url, _ in running], pool


def _ask(client: httpx.Client, gateway: str, key: str, **extra: object) -> httpx.Response:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 16, **extra}
    headers = {"Authorization": f"Bearer {KEYS[key]}"}
    return client.post(f"{gateway}/v1/chat/completions", json=body, headers=headers)


def test_load_through_both_gateways_reaches_both_replicas_and_sessions_stay(
    gateways: tuple[list[str], list[str]],
) -> None:
    urls, pool = gateways
    before = {url: _served(url) for url in pool}

    def client_loop(worker: int) -> list[tuple[int, str, str]]:
        seen = []
        with httpx.Client(timeout=120) as client:
            for i in range(4):  # bounded: 4 clients x 4 requests
                answer = _ask(client, urls[(worker + i) % 2], "load")
                seen.append(
                    (
                        answer.status_code,
                        answer.headers.get("x-route-tier", ""),
                        answer.headers.get("x-route-endpoint", ""),
                    )
                )
        return seen

    with ThreadPoolExecutor(4) as pool_of_clients:
        results = [r for rs in pool_of_clients.map(client_loop, range(4)) for r in rs]
    assert [status for status, _, _ in results] == [200] * 16, results
    assert {tier for _, tier, _ in results} == {"int4"}
    served = {url: _served(url) - before[url] for url in pool}
    assert all(n >= 2 for n in served.values()), served  # least loaded first: both take load
    assert len({endpoint for _, _, endpoint in results}) == 2

    # A conversation keeps its replica (prefix-cache reuse), whichever gateway it goes through.
    with httpx.Client(timeout=120) as client:
        endpoints = {
            _ask(client, urls[i % 2], "load", user="conversation-42").headers["x-route-endpoint"]
            for i in range(4)
        }
    assert len(endpoints) == 1, endpoints


def test_one_rate_limit_across_both_gateways(gateways: tuple[list[str], list[str]]) -> None:
    urls, _ = gateways
    statuses = []
    with httpx.Client(timeout=120) as client:
        for i in range(LIMIT + 6):  # bounded; alternating gateways
            statuses.append(_ask(client, urls[i % 2], "limit", max_tokens=1).status_code)
    # The limit, not the limit times the replicas: exactly LIMIT pass in the minute.
    assert statuses == [200] * LIMIT + [429] * 6, statuses


def test_a_replica_killed_under_load_loses_no_request(
    gateways: tuple[list[str], list[str]], stack: Stack
) -> None:
    urls, pool = gateways
    replica_port = pool[1].rsplit(":", 1)[1]
    victim = next(
        p
        for p in psutil.process_iter(["cmdline"])
        if "--port" in (p.info["cmdline"] or [])
        and p.info["cmdline"][p.info["cmdline"].index("--port") + 1] == replica_port
    )
    results: list[int] = []

    def client_loop(worker: int) -> None:
        with httpx.Client(timeout=120) as client:
            for i in range(5):  # bounded: 3 clients x 5 requests
                try:
                    results.append(_ask(client, urls[(worker + i) % 2], "kill").status_code)
                except httpx.HTTPError as exc:
                    results.append(-1)
                    print(f"client {worker}: {exc!r}")

    with ThreadPoolExecutor(3) as clients:
        running = [clients.submit(client_loop, w) for w in range(3)]
        time.sleep(2)
        os.killpg(victim.pid, signal.SIGKILL)
        for job in running:
            job.result(timeout=300)
    assert results == [200] * 15, results
    assert httpx.get(f"{stack.tier_urls['int4']}/health", timeout=5).status_code == 200
