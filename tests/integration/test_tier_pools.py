"""A tier as a pool of two real vLLM replicas behind two gateway processes sharing Redis.

The second replica of int4 is the stack's own int4 server started again on another loopback
port (the same argv and environment, so the same weights, flags and tier key). Two
``python -m gateway`` processes route over ``int4: endpoints [stack's, replica]``; without
measurements the shipped policy's tolerant route starts with int4, so chat lands on the pool.
The gateways' policy is the shipped one with pinning allowed (the conversations pin int4: their
long prompts would otherwise be classed ``long``) and no scheduled resets (only the one a test
asks for).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest
import yaml

from backends.metrics import TierMetrics
from gateway.config import TierEndpoint, hash_key
from gateway.request.route.endpoint_choice import endpoint_id
from measure.conversations import (
    Phase,
    Plan,
    Turn,
    converse,
    plan,
    pool_cache,
    questions,
    scrape,
    settled,
)
from model_optimizer.envs import ROOT
from model_optimizer.soak import reset_now
from tests.integration.conftest import (
    ADMIN_KEY,
    TIER_KEY,
    Stack,
    gateway_config,
    gateway_processes,
    second_server,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "SmolLM2-135M-Instruct"
# One key per test: the per-key rate limit (LIMIT a minute, a sliding window shared through
# Redis) then starts empty in each.
KEYS = {"load": "pool-load-key", "limit": "pool-limit-key", "kill": "pool-kill-key"}
LIMIT = 40
# The conversations' keys (one per conversation: 4 turns each, far under LIMIT) and the reset
# test's (each client takes a new key every RESET_PER_KEY requests, under LIMIT a minute).
CONVERSATIONS, TURNS = 8, 4  # per mode
CACHE_KEYS = [f"pool-cache-key-{i}" for i in range(2 * CONVERSATIONS)]
RESET_CLIENTS, RESET_REQUESTS, RESET_PER_KEY = 3, 150, 30
RESET_KEYS = [f"pool-reset-key-{i}" for i in range(RESET_CLIENTS * RESET_REQUESTS // RESET_PER_KEY)]
PIN = {"x-route-tier": "int4"}
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
    folder = tmp_path_factory.mktemp("replica")
    with second_server(stack, "int4", folder) as url:  # it loads the model, as the stack's did
        yield url


@pytest.fixture(scope="module")
def gateways(
    stack: Stack, replica: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[list[str], list[str]]]:
    """Two gateway processes; yields their URLs and the int4 pool's endpoints."""
    folder = tmp_path_factory.mktemp("pool-gateways")
    policy = yaml.safe_load((ROOT / "policies" / "routing.yaml").read_text())
    policy["pinning"]["allow"] = True
    policy["resets"]["enabled"] = False
    (folder / "routing.yaml").write_text(yaml.safe_dump(policy))
    config = gateway_config(
        stack,
        policy_path=str(folder / "routing.yaml"),
        redis_url="redis://127.0.0.1:6379/0",
        redis_prefix=f"mo:test:{uuid.uuid4().hex[:8]}",
        api_key_hashes=[hash_key(k) for k in (*KEYS.values(), *CACHE_KEYS, *RESET_KEYS)],
        admin_key_hashes=[hash_key(ADMIN_KEY)],
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
    with gateway_processes(config, folder, 2) as running:
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


def test_a_conversation_kept_on_its_replica_finds_its_prefix_cached(
    gateways: tuple[list[str], list[str]],
) -> None:
    """Multi-turn conversations with long prompts, each turn resending the history: with one
    session key each (affinity) against a new random key per turn (spread over the replicas as
    without affinity), in interleaved phases; the hit rate is both replicas' own counters."""
    urls, pool = gateways
    texts, nonce = questions(), uuid.uuid4().hex[:8]
    phases = {mode: Phase(mode) for mode in ("affinity", "spread")}
    with httpx.Client(timeout=30) as reader:

        def read() -> dict[str, TierMetrics]:
            return scrape(reader, pool, MODEL)

        for round_ in range(2):  # affinity, spread, affinity, spread
            for m, (mode, phase) in enumerate(phases.items()):
                ids = [(2 * round_ + m) * CONVERSATIONS // 2 + i for i in range(CONVERSATIONS // 2)]
                plans = [plan(i, f"{nonce}-{i}", texts, TURNS) for i in ids]
                before = read()
                with ThreadPoolExecutor(2) as clients:  # two at a time, alternate gateways
                    talks = list(
                        clients.map(
                            _talk, [urls[i % 2] for i in ids], plans, [mode] * len(ids), ids
                        )
                    )
                phase.conversations += talks
                sent = sum(t.status == 200 for turns in talks for t in turns)
                phase.cache.append(pool_cache(before, settled(read, before, sent)))
    affinity, spread = phases["affinity"], phases["spread"]
    figures = {
        mode: (p.hit_rate, dict(p.endpoint_split()), p.kept(), [c.per_replica for c in p.cache])
        for mode, p in phases.items()
    }
    print(f"prefix-cache hit rate, split, conversations kept, per replica: {figures}")
    for phase in phases.values():
        assert [t.status for t in phase.turns] == [200] * CONVERSATIONS * TURNS, figures
        assert {t.tier for t in phase.turns} == {"int4"}
        assert set(phase.endpoint_split()) <= {endpoint_id(url) for url in pool}
    assert affinity.kept() == CONVERSATIONS, figures  # whichever gateway each turn went through
    assert spread.kept() < CONVERSATIONS, figures  # without its own key a conversation moves
    assert affinity.hit_rate is not None and spread.hit_rate is not None, figures
    # Expected about 0.64 against 0.43 (with 128-token blocks); a chance spread that keeps most
    # conversations in place narrows the gap, never below ~0.07 in 4,000 simulated runs.
    assert affinity.hit_rate >= spread.hit_rate + 0.05, figures


def _talk(gateway: str, conversation: Plan, mode: str, index: int) -> list[Turn]:
    headers = {"Authorization": f"Bearer {CACHE_KEYS[index]}", **PIN}
    with httpx.Client(timeout=120) as client:
        return converse(client, gateway, conversation, mode, model=MODEL, headers=headers)


OUT = ("draining", "resetting")  # an endpoint a pool reset holds out of routing


def _gateway_warnings(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The gateways' warnings (a Redis timeout sends a replica's shared state local for a
    while): what a failed assertion about the marks needs beside the views."""
    logs = sorted(tmp_path_factory.getbasetemp().glob("pool-gateways*/gateway*.log"))
    lines = [
        f"{log.name}: {line}"
        for log in logs
        for line in log.read_text(errors="replace").splitlines()
        if "WARNING" in line or "Redis" in line
    ]
    return "\n".join(lines[-40:]) or "(no warnings in the gateways' logs)"


def test_a_pool_reset_rolls_one_replica_at_a_time_and_no_request_fails(
    gateways: tuple[list[str], list[str]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    urls, pool = gateways
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    stop = threading.Event()
    answers: list[tuple[float, float, int, str]] = []  # start, end, status, x-route-tier
    views: list[tuple[float, int, str, tuple[str, ...]]] = []  # when, gateway, tier, endpoints

    def client_loop(worker: int) -> None:
        with httpx.Client(timeout=120) as client:
            for i in range(RESET_REQUESTS):  # bounded even if the reset never ends
                if stop.is_set():
                    return
                key = RESET_KEYS[worker * RESET_REQUESTS // RESET_PER_KEY + i // RESET_PER_KEY]
                body = {"model": MODEL, "messages": CHAT, "max_tokens": 8}
                start = time.monotonic()
                try:
                    answer = client.post(
                        f"{urls[(worker + i) % 2]}/v1/chat/completions",
                        json=body,
                        headers={"Authorization": f"Bearer {key}"},
                    )
                    route = answer.headers.get("x-route-tier", answer.text[:200])
                    answers.append((start, time.monotonic(), answer.status_code, route))
                except httpx.HTTPError as exc:
                    answers.append((start, time.monotonic(), -1, repr(exc)))

    def watch() -> None:
        """Both gateways' view of int4 and its endpoints (in pool order), every ~0.1 s."""
        with httpx.Client(timeout=10) as client:
            for _ in range(6000):  # bounded
                if stop.is_set():
                    return
                for g, url in enumerate(urls):
                    int4 = client.get(f"{url}/admin/tiers", headers=admin).json()["tiers"]["int4"]
                    states = {e["url"]: e["state"] for e in int4["endpoints"]}
                    views.append(
                        (time.monotonic(), g, int4["state"], tuple(states[u] for u in pool))
                    )
                time.sleep(0.1)

    with ThreadPoolExecutor(RESET_CLIENTS + 1) as threads:
        jobs = [threads.submit(client_loop, w) for w in range(RESET_CLIENTS)]
        jobs.append(threads.submit(watch))
        try:
            time.sleep(2)  # load before the reset
            record = reset_now(urls[1], "int4", ADMIN_KEY, timeout=240)
            time.sleep(2)  # and after it
        finally:
            stop.set()
            for job in jobs:
                job.result(timeout=300)
    print(f"reset {record}; {len(answers)} requests; {len(views)} views of the gateways")
    failed = [a for a in answers if a[2] != 200 or a[3] != "int4"]
    assert not failed, failed  # every request answered, by the pool: the tier never left routing
    assert record["outcome"] == "ok", record
    detail = str(record["detail"])  # "<url>: ok (...); <url>: ok (...)", in pool order
    assert detail.startswith(f"{pool[0]}: ok") and f"; {pool[1]}: ok" in detail, detail
    assert views and all(tier == "ready" for _, _, tier, _ in views)
    warnings = _gateway_warnings(tmp_path_factory)
    print(warnings)
    for g in range(len(urls)):
        seen = [(when, states) for when, gw, _, states in views if gw == g]
        # Never both endpoints out at once, in either gateway's view...
        assert all(sum(s in OUT for s in states) <= 1 for _, states in seen), (seen, warnings)
        assert all("ready" in states for _, states in seen), (seen, warnings)
        out = [[when for when, states in seen if states[i] in OUT] for i in range(len(pool))]
        assert all(out), f"gateway {g} never saw an endpoint out: {seen}"
        # ...and one after the other, in pool order
        assert max(out[0]) < min(out[1]), (seen, warnings)
        # Requests were answered while each endpoint was out: the load went on through the roll.
        for i, times in enumerate(out):
            during = sum(s < max(times) and e > min(times) for s, e, _, _ in answers)
            print(
                f"gateway {g}: endpoint {i} out {max(times) - min(times):.1f} s, {during} answered"
            )
            assert during > 0, answers


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
