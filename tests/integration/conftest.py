"""One real stack per test run: ``model-optimizer up`` on the embedded default model.

The stack is the real CLI in a subprocess (vLLM-CPU tier + gateway, loopback only), started
once per session; tests that must stop or break it start their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from backends.process import free_port
from model_optimizer.envs import ROOT

pytestmark = pytest.mark.integration
START_TIMEOUT = 1800.0  # a cold cache converts the model and builds its variants first
TIERS = ("fp16", "int8", "int4")
ADMIN_KEY = "integration-admin-key"


@dataclass
class Stack:
    process: subprocess.Popen[bytes]
    gateway_url: str
    tier_urls: dict[str, str]
    log: Path
    policy: Path  # the stack's own copy of policies/routing.yaml, which tests may edit
    descendants: list[psutil.Process] = field(default_factory=list)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def tier_port(self, name: str) -> int:
        return int(self.tier_urls[name].rsplit(":", 1)[1])


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports."""
    for _ in range(200):
        base = free_port()
        if base + count < 65000 and all(_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no run of free ports")


def _free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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


def start_stack(log: Path, tiers: tuple[str, ...] = TIERS) -> Stack:
    """Start ``model-optimizer up`` on free loopback ports and wait until the gateway is ready.

    The gateway routes by a copy of policies/routing.yaml beside ``log`` (so a test may edit
    it), shares state in the machine's Redis and accepts ``ADMIN_KEY`` on /admin.
    """
    gw_port, base = free_port(), free_port_run(len(tiers))
    policy = log.parent / "routing.yaml"
    policy.write_text((ROOT / "policies" / "routing.yaml").read_text())
    args = ["--port", str(gw_port), "--tier-port", str(base), "--tiers", ",".join(tiers)]
    args += ["--policy", str(policy)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "model_optimizer.cli", "up", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "MO_GATEWAY_ADMIN_KEYS": ADMIN_KEY},
        )
    urls = {name: f"http://127.0.0.1:{base + i}" for i, name in enumerate(tiers)}
    stack = Stack(process, f"http://127.0.0.1:{gw_port}", urls, log, policy)
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
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = start_stack(tmp_path_factory.mktemp("stack") / "up.log")
    yield running
    stop_stack(running)
