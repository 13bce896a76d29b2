"""A ``model-optimizer up`` stack for the routing benchmarks (bench_live_routes.py,
bench_route_stability.py): started on free loopback ports with an admin key, waited for, read
through the admin API, stopped with SIGINT (up stops its tiers), its log kept in a file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.process import free_port  # noqa: E402

ADMIN_KEY = "bench-routing-admin-key"
READY_S = 1800.0  # the first run builds the variants


@dataclass(frozen=True)
class Stack:
    url: str
    log: Path

    def admin(self, path: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        answer = httpx.get(f"{self.url}{path}", headers=headers, timeout=30)
        answer.raise_for_status()
        return dict(answer.json())

    def chains(self) -> dict[str, list[str]]:
        """Each class's route now (``GET /admin/routes``)."""
        classes = self.admin("/admin/routes")["classes"]
        return {cls: list(entry["tiers"]) for cls, entry in sorted(classes.items())}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def wait_ready(url: str, seconds: float, process: subprocess.Popen[bytes] | None = None,
               what: str = "the stack") -> None:  # fmt: skip
    """Until ``url``/readyz answers 200; a ``SystemExit`` naming ``what`` when ``process``
    exits first or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while True:
        if process is not None and process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} was not ready in {seconds:.0f} s")
        time.sleep(0.3)


@contextmanager
def up_stack(log: Path, extra: Sequence[str] = ()) -> Iterator[Stack]:
    """``model-optimizer up`` with ``extra`` arguments, ready; stopped on exit."""
    port, tier_port = free_port(), free_port()
    args = ["up", "--port", str(port), "--tier-port", str(tier_port), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MO_GATEWAY_ADMIN_KEYS": ADMIN_KEY}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "model_optimizer.cli", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, READY_S, process, f"model-optimizer up ({log})")
        yield Stack(url, log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def server_pid(port: int) -> int:
    """The engine server listening on ``port`` (its command line names ``--port <port>``)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for i, arg in enumerate(argv[:-1]):
            if arg == b"--port" and argv[i + 1] == str(port).encode():
                return int(entry.name)
    raise SystemExit(f"no engine server names --port {port}")
