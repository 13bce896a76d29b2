"""``model-optimizer soak``: steady load through a gateway, bounded in time and count.

``clients`` threads send short chat requests (chit-chat and code, so several tiers serve)
through the gateway for ``seconds``; halfway through, a KV-pool reset of ``reset_tier`` is
asked for through ``/admin/resets`` (with an admin key). The result counts requests sent and
lost (anything but 200) and the gateway process's RSS at the start and the end. Loopback URLs
only; every loop stops by itself (time and a per-client cap).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import psutil

PROMPTS = ("Hi! How are you today?", "Write a Python function that adds two numbers.")
PER_CLIENT_CAP = 100_000


@dataclass(frozen=True)
class SoakResult:
    sent: int
    lost: int
    statuses: dict[int, int]  # status (-1: no answer) -> count
    rss_start_mb: float
    rss_end_mb: float
    reset_outcome: str | None  # the reset's recorded outcome (None: no reset asked)
    seconds: float


def soak(
    url: str,
    model: str,
    *,
    clients: int = 3,
    seconds: float = 60.0,
    gateway_pid: int | None = None,
    reset_tier: str | None = None,
    admin_key: str | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> SoakResult:
    """Run the load (see the module docstring) and return what was measured."""
    if not url.startswith(("http://127.", "http://localhost")):
        raise ValueError(f"soak only targets loopback gateways, not {url}")
    statuses: list[int] = []
    stop = threading.Event()
    rss_start = _rss_mb(gateway_pid)
    started = time.monotonic()
    workers = [
        threading.Thread(target=_client, args=(url, model, i, stop, statuses), daemon=True)
        for i in range(clients)
    ]
    for worker in workers:
        worker.start()
    outcome = None
    try:
        if reset_tier is not None:
            _sleep_until(started + seconds / 2, stop)
            say(f"asking for a reset of {reset_tier} ({len(statuses)} requests so far)")
            try:
                record = reset_now(url, reset_tier, admin_key or "", timeout=seconds * 3.5)
                outcome = str(record["outcome"])
            except ResetNotDone as exc:
                outcome = str(exc)
            say(f"reset of {reset_tier}: {outcome}")
        _sleep_until(started + seconds, stop)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=180)
    counts: dict[int, int] = {}
    for status in statuses:
        counts[status] = counts.get(status, 0) + 1
    return SoakResult(
        sent=len(statuses),
        lost=sum(n for status, n in counts.items() if status != 200),
        statuses=counts,
        rss_start_mb=rss_start,
        rss_end_mb=_rss_mb(gateway_pid),
        reset_outcome=outcome,
        seconds=time.monotonic() - started,
    )


def _client(url: str, model: str, index: int, stop: threading.Event, out: list[int]) -> None:
    with httpx.Client(timeout=120, trust_env=False) as client:
        for i in range(PER_CLIENT_CAP):
            if stop.is_set():
                return
            body = {
                "model": model,
                "messages": [{"role": "user", "content": PROMPTS[(index + i) % 2]}],
                "max_tokens": 4,
            }
            try:
                out.append(client.post(f"{url}/v1/chat/completions", json=body).status_code)
            except httpx.HTTPError:
                out.append(-1)


class ResetNotDone(RuntimeError):
    """A reset asked through ``/admin/resets`` was refused or not recorded in time."""


def reset_now(url: str, tier: str, key: str, timeout: float = 300.0) -> dict[str, object]:
    """Ask the gateway at ``url`` to reset ``tier`` now and wait (at most ``timeout`` s) for its
    record in the reset history; ``ResetNotDone`` (one line) otherwise."""
    headers = {"Authorization": f"Bearer {key}"}
    asked = time.time() - 1
    answer = httpx.post(f"{url}/admin/resets/{tier}", headers=headers, timeout=10)
    if answer.status_code != 202:
        raise ResetNotDone(f"reset of {tier} refused: HTTP {answer.status_code} {answer.text}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        history = httpx.get(f"{url}/admin/resets", headers=headers, timeout=10).json()["history"]
        for record in history:
            if record["tier"] == tier and record["started_at"] >= asked:
                return dict(record)
        time.sleep(0.5)
    raise ResetNotDone(f"no reset of {tier} recorded in {timeout:g} s")


def _sleep_until(when: float, stop: threading.Event) -> None:
    while time.monotonic() < when and not stop.is_set():
        time.sleep(min(0.5, max(0.0, when - time.monotonic())))


def _rss_mb(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    try:
        return float(psutil.Process(pid).memory_info().rss) / 2**20
    except psutil.Error:
        return float("nan")


def render(result: SoakResult) -> str:
    """A Markdown table of the result."""
    statuses = ", ".join(f"{status}: {n}" for status, n in sorted(result.statuses.items()))
    return "\n".join(
        [
            "| seconds | requests sent | lost | statuses | gateway RSS start MB | end MB | reset |",
            "|---|---|---|---|---|---|---|",
            f"| {result.seconds:.0f} | {result.sent} | {result.lost} | {statuses} | "
            f"{result.rss_start_mb:.1f} | {result.rss_end_mb:.1f} | {result.reset_outcome} |",
        ]
    )
