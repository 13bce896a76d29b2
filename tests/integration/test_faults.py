"""Faults on the real stack: a tier killed mid-stream, Redis gone under load, bad policy edits."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from backends.process import free_port
from gateway.config import GatewayConfig, TierEndpoint, hash_key
from model_optimizer.envs import ROOT, cache_root
from tests.integration.conftest import ADMIN_KEY, Stack

pytestmark = pytest.mark.integration
MODEL = "SmolLM2-135M-Instruct"
CHAT = [{"role": "user", "content": "Hi! How are you doing today?"}]
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _ask(url: str, max_tokens: int = 2) -> int:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": max_tokens}
    try:
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).status_code
    except httpx.HTTPError:
        return -1


def _tier_process(stack: Stack, name: str) -> psutil.Process:
    port = str(stack.tier_port(name))
    for proc in psutil.Process(stack.process.pid).children(recursive=True):
        cmd = proc.cmdline()
        if "--port" in cmd and cmd[cmd.index("--port") + 1] == port:
            return proc
    raise AssertionError(f"no process serves tier {name}")


def test_a_tier_killed_mid_stream_ends_the_stream_cleanly_and_comes_back(stack: Stack) -> None:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 400, "ignore_eos": True}
    events: list[str] = []
    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "POST", f"{stack.gateway_url}/v1/chat/completions", json={**body, "stream": True}
        ) as answer,
    ):
        tier = answer.headers["x-route-tier"]
        lines = answer.iter_lines()
        events.append(next(line for line in lines if line.startswith("data: ")))
        _tier_process(stack, tier).kill()
        events += [line for line in lines if line.startswith("data: ")]  # must end, not hang
    assert events[-1] == "data: [DONE]"
    assert '"error"' in events[-2], events[-3:]  # one clean SSE error event, no second answer
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{stack.tier_urls[tier]}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(2)
    else:
        pytest.fail(f"tier {tier} was not restarted:\n{stack.log_text()[-2000:]}")
    states = httpx.get(f"{stack.gateway_url}/admin/tiers", headers=ADMIN, timeout=10).json()
    deadline = time.monotonic() + 30
    while states["tiers"][tier]["state"] != "ready" and time.monotonic() < deadline:
        time.sleep(1)
        states = httpx.get(f"{stack.gateway_url}/admin/tiers", headers=ADMIN, timeout=10).json()
    assert states["tiers"][tier]["state"] == "ready"
    assert _ask(stack.gateway_url) == 200


def test_bad_policy_files_never_replace_the_serving_one(stack: Stack) -> None:
    original = stack.policy.read_text()
    admin = f"{stack.gateway_url}/admin/policy"
    digest = httpx.get(admin, headers=ADMIN, timeout=10).json()["digest"]
    bad = {
        "garbage": "tiers: [fp16\n  - ]]: ::\n",
        "empty": "",
        "unknown tier": original.replace("tolerant: [int4, int8, fp16]", "tolerant: [int2]"),
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
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed"
    port = free_port()
    servers: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        servers.append(
            subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(tmp_path),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("redis-server did not start")

    start()
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
    config = GatewayConfig(
        model_name=MODEL,
        tiers=[
            TierEndpoint(name=name, base_url=url, max_model_len=2048)
            for name, url in stack.tier_urls.items()
        ],
        policy_path=str(ROOT / "policies" / "routing.yaml"),
        tokenizer_dir=str(cache_root() / "variants" / MODEL / "fp16"),
        redis_url=f"redis://127.0.0.1:{port}/0",
        redis_prefix=f"mo:test:{uuid.uuid4().hex[:8]}",
        admin_key_hashes=[hash_key(key)],
        metrics_interval=1.0,
    )
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
    gw_port = free_port()
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        gateway = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway",
                "--config",
                str(tmp_path / "gateway.yaml"),
                "--port",
                str(gw_port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    url = f"http://127.0.0.1:{gw_port}"
    statuses: list[int] = []
    stop = threading.Event()

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
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert shared()
        worker.start()
        _wait(lambda: len(statuses) >= 3)
        servers[-1].send_signal(signal.SIGKILL)
        servers[-1].wait(timeout=10)
        answered = len(statuses)
        _wait(lambda: len(statuses) >= answered + 3 and not shared())  # served without Redis
        servers.append(  # the same server again, on the same port
            subprocess.Popen(servers[0].args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        _wait(shared, timeout=30)  # picked Redis back up by itself
        answered = len(statuses)
        _wait(lambda: len(statuses) >= answered + 2)
    finally:
        stop.set()
        if worker.is_alive():
            worker.join(timeout=300)
        gateway.terminate()
        gateway.wait(timeout=20)
    assert statuses and all(status == 200 for status in statuses), sorted(set(statuses))
    text = log.read_text()
    assert text.count("using local state") == 1, text[-2000:]  # logged once


def _wait(condition: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)
