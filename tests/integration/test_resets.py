"""KV-pool resets on the real tiers: under load through the gateway, and across two replicas."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.config import hash_key
from model_optimizer.envs import ROOT
from model_optimizer.soak import reset_now
from tests.integration.conftest import (
    ADMIN_KEY,
    Stack,
    gateway_config,
    gateway_processes,
    wait_until,
)

pytestmark = pytest.mark.integration
MODEL = "SmolLM2-135M-Instruct"
PROMPTS = ["Hi! How are you today?", "Write a Python function that adds two numbers."]


def _admin(key: str = ADMIN_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.slow
def test_each_tier_resets_under_load_without_a_failed_request(stack: Stack) -> None:
    results: list[int] = []
    refusals: list[str] = []  # the body of each answer that is not a 200: it says why
    stop = threading.Event()

    def load(worker: int) -> None:
        with httpx.Client(timeout=120) as client:
            for i in range(300):  # bounded even if the resets never finish
                if stop.is_set():
                    return
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": PROMPTS[(worker + i) % 2]}],
                    "max_tokens": 4,
                }
                try:
                    answer = client.post(f"{stack.gateway_url}/v1/chat/completions", json=body)
                    results.append(answer.status_code)
                    if answer.status_code != 200:
                        refusals.append(f"{answer.status_code} {answer.text[:300]}")
                except httpx.HTTPError:
                    results.append(-1)

    records = []
    with ThreadPoolExecutor(2) as pool:
        workers = [pool.submit(load, w) for w in range(2)]
        try:
            for tier in ("fp16", "int8", "int4"):
                records.append(reset_now(stack.gateway_url, tier, ADMIN_KEY, timeout=180))
        finally:
            stop.set()
            for worker in workers:
                worker.result(timeout=300)
    for record in records:
        # "ok" means the reset primitive's probe saw the prefix cache empty afterwards.
        assert record["outcome"] == "ok", f"{record}\n{_reset_lines(stack)}"
    assert results and all(status == 200 for status in results), (
        sorted(set(results)),
        refusals,
        _reset_lines(stack),
    )
    metrics = httpx.get(f"{stack.gateway_url}/metrics", timeout=10).text
    assert 'gateway_kv_resets_total{outcome="ok",tier="int8"}' in metrics


def _reset_lines(stack: Stack) -> str:
    """The gateway's log lines about resets and refusals (what a failure message needs)."""
    lines = stack.log_text().splitlines()
    return "\n".join(x for x in lines if "reset" in x.lower() or " 503" in x)[-3000:]


def test_an_unknown_tier_cannot_be_reset(stack: Stack) -> None:
    answer = httpx.post(f"{stack.gateway_url}/admin/resets/fp64", headers=_admin(), timeout=10)
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "unknown_tier"


KEY = "reset-replica-admin-key"
LOCK_TTL = 3.0


@pytest.fixture
def replicas(stack: Stack, tmp_path: Path) -> Iterator[list[tuple[str, subprocess.Popen[bytes]]]]:
    """Two ``python -m gateway`` processes sharing one Redis prefix and a short leader lock."""
    policy = yaml.safe_load((ROOT / "policies" / "routing.yaml").read_text())
    policy["resets"].update(
        {"enabled": False, "lock_ttl_seconds": LOCK_TTL, "drain_timeout_seconds": 120}
    )
    policy_path = tmp_path / "routing.yaml"
    policy_path.write_text(yaml.safe_dump(policy))
    config = gateway_config(
        stack,
        policy_path=str(policy_path),
        redis_url="redis://127.0.0.1:6379/0",
        redis_prefix=f"mo:test:{uuid.uuid4().hex[:8]}",
        admin_key_hashes=[hash_key(KEY)],
        metrics_interval=1.0,
    )
    with gateway_processes(config, tmp_path, 2) as running:
        yield running


def test_one_replica_leads_and_a_dead_leader_lets_the_tier_go(
    replicas: list[tuple[str, subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    (first, _), (second, _) = replicas
    long_body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPTS[0]}],
        # long enough to outlast the drain on a fast CPU (~55 tokens/s on an AVX-512 EPYC)
        "max_tokens": 1000,
        "ignore_eos": True,
    }
    with ThreadPoolExecutor(1) as pool:
        # A long answer on int4 keeps the reset waiting in its drain phase.
        busy = pool.submit(httpx.post, f"{first}/v1/chat/completions", json=long_body, timeout=120)
        wait_until(lambda: _tiers(second)["int4"]["in_flight"] == 1)
        assert httpx.post(f"{second}/admin/resets/int4", headers=_admin(KEY)).status_code == 202
        # The leader marks the tier at once; the other replica sees the shared
        # mark on its next scrape (metrics_interval), so both are waited for.
        try:
            wait_until(lambda: _tiers(first)["int4"]["state"] == "draining")
            wait_until(lambda: _tiers(second)["int4"]["state"] == "draining")
        except AssertionError:  # say what the replicas decided, what int4 did, what they logged
            views = [(_resets(url)["last_decision"], _tiers(url)["int4"]) for url, _ in replicas]
            pytest.fail(f"int4 never showed draining on both replicas: {views}; {_logs(tmp_path)}")
        # Exactly one replica leads, and both name it. Read while int4 drains; a read can
        # come back empty when a loaded machine delays Redis past the lock's op timeout,
        # so it is asked again for a few seconds, and what was seen is told on failure.
        views: list[dict[str, Any]] = []

        def one_leader() -> bool:
            views[:] = [_resets(url) for url, _ in replicas]
            holders = {v["leader"]["holder"] for v in views}
            leading = [v["leader"]["holder"] == v["leader"]["this_replica"] for v in views]
            return len(holders) == 1 and sum(leading) == 1

        try:
            wait_until(one_leader, timeout=10)
        except AssertionError:
            said = "done: " + busy.result().text[:200] if busy.done() else "still running"
            seen = [(v["leader"], v["current"], v["history"][:2]) for v in views]
            pytest.fail(f"not exactly one leader while int4 drained: {seen}; long answer {said}")
        assert not busy.done(), busy.result().text[:300]  # the drain has not ended
        leader = 0 if views[0]["leader"]["holder"] == views[0]["leader"]["this_replica"] else 1
        survivor_url = replicas[1 - leader][0]
        replicas[leader][1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        # The dead leader's marks expire with its lock: the tier is routed to again.
        wait_until(lambda: _tiers(survivor_url)["int4"]["state"] == "ready", timeout=LOCK_TTL + 10)
        assert time.monotonic() - killed_at < LOCK_TTL + 10
        record = _wait_for_record(survivor_url, "abandoned")
        assert record["tier"] == "int4"
        if leader == 1:  # the long request went through the survivor: it must complete
            assert busy.result(timeout=120).status_code == 200


def _logs(folder: Path) -> str:
    """The last lines each replica logged (gateway_processes keeps them in gateway<i>.log)."""
    tails = []
    for i in range(2):
        lines = (folder / f"gateway{i}.log").read_text(errors="replace").splitlines()
        tails.append(f"replica {i} logged: " + " | ".join(lines[-15:]))
    return "; ".join(tails)


def _wait_for_record(url: str, outcome: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for record in _resets(url)["history"]:
            if record["outcome"] == outcome:
                return dict(record)
        time.sleep(0.5)
    pytest.fail(f"no {outcome} reset recorded at {url}")


def _tiers(url: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/admin/tiers", headers=_admin(KEY), timeout=10)
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["tiers"])


def _resets(url: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/admin/resets", headers=_admin(KEY), timeout=10)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())
