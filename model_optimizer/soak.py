"""``model-optimizer soak``: steady load through a gateway, bounded in time and count.

``clients`` threads send short chat requests (chit-chat and code, so several tiers serve;
every other one streamed, long enough for a fault to land in the middle of it) through the
gateway for ``seconds``; halfway through, a KV-pool reset of ``reset_tier`` is asked for
through ``/admin/resets`` (with an admin key); every ``kill_every`` seconds ``kill`` is called
(it SIGKILLs a tier's server: ``kill_tier`` finds it by its port). The result counts requests
sent and lost (anything but 200; a stream counts 200 only when it ends with ``[DONE]`` and no
error event: ``STREAM_BROKEN`` otherwise) and the gateway process's RSS at the start and the
end. Loopback URLs only; every loop stops by itself (time and a per-client cap).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import psutil

PROMPTS = ("Hi! How are you today?", "Write a Python function that adds two numbers.")
PER_CLIENT_CAP = 100_000
WHOLE_TOKENS, STREAM_TOKENS = 4, 48  # the answer lengths of whole and streamed requests
STREAM_BROKEN = 599  # a stream that ended with an error event or without [DONE]


@dataclass(frozen=True)
class SoakResult:
    sent: int
    lost: int
    statuses: dict[int, int]  # status (-1: no answer) -> count
    rss_start_mb: float
    rss_end_mb: float
    reset_outcome: str | None  # the reset's recorded outcome (None: no reset asked)
    seconds: float
    kills: tuple[str, ...] = ()  # what each kill hit, in order


def soak(
    url: str,
    model: str,
    *,
    clients: int = 3,
    seconds: float = 60.0,
    gateway_pid: int | None = None,
    reset_tier: str | None = None,
    admin_key: str | None = None,
    kill_every: float | None = None,
    kill: Callable[[], str] | None = None,
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
    kills: list[str] = []
    if kill_every is not None and kill is not None:
        killer = threading.Thread(
            target=_kill_loop, args=(kill, kill_every, stop, kills, say), daemon=True
        )
        workers.append(killer)
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
                if outcome != "ok":  # what a failure needs: why, where the time went, the tier
                    phases = record.get("phases") or {}
                    outcome += f": {record.get('detail', '')}; phases {phases}; now " + _tier_now(
                        url, reset_tier, admin_key or ""
                    )
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
        kills=tuple(kills),
    )


def _client(url: str, model: str, index: int, stop: threading.Event, out: list[int]) -> None:
    with httpx.Client(timeout=120, trust_env=False) as client:
        for i in range(PER_CLIENT_CAP):
            if stop.is_set():
                return
            kind = (index + i) % 4  # both prompts, whole and streamed
            body = {
                "model": model,
                "messages": [{"role": "user", "content": PROMPTS[kind % 2]}],
                "max_tokens": WHOLE_TOKENS if kind < 2 else STREAM_TOKENS,
            }
            try:
                if kind < 2:
                    out.append(client.post(f"{url}/v1/chat/completions", json=body).status_code)
                else:
                    out.append(_streamed(client, f"{url}/v1/chat/completions", body))
            except httpx.HTTPError:
                out.append(-1)


def _streamed(client: httpx.Client, url: str, body: dict[str, object]) -> int:
    """A streamed request's outcome: its status, or ``STREAM_BROKEN`` for a 200 whose events
    hold an error or do not end with ``[DONE]``."""
    with client.stream("POST", url, json={**body, "stream": True}) as answer:
        events = [line for line in answer.iter_lines() if line.startswith("data: ")]
    if answer.status_code != 200:
        return answer.status_code
    broken = not events or events[-1] != "data: [DONE]" or any('"error"' in e for e in events)
    return STREAM_BROKEN if broken else 200


def _kill_loop(
    kill: Callable[[], str],
    every: float,
    stop: threading.Event,
    kills: list[str],
    say: Callable[[str], None],
) -> None:
    next_kill = time.monotonic() + every
    while True:
        _sleep_until(next_kill, stop)
        if stop.is_set():
            return
        try:
            kills.append(kill())
            say(f"killed {kills[-1]}")
        except (OSError, psutil.Error, LookupError) as exc:
            kills.append(f"failed: {exc}")
            say(f"could not kill: {exc}")
        next_kill += every


def kill_tier(url: str, tier: str, key: str) -> Callable[[], str]:
    """A ``kill`` for ``soak``: SIGKILL the process listening on ``tier``'s first endpoint's
    port (read from the gateway's ``/admin/tiers``; a loopback tier on this machine)."""

    def kill() -> str:
        headers = {"Authorization": f"Bearer {key}"}
        described = httpx.get(f"{url}/admin/tiers", headers=headers, timeout=10).json()
        tier_url = str(described["tiers"][tier]["base_url"])
        port = httpx.URL(tier_url).port
        if not tier_url.startswith(("http://127.", "http://localhost")) or port is None:
            raise LookupError(f"tier {tier} is not a loopback server ({tier_url})")
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                if conn.pid is None:
                    raise LookupError(f"cannot see which process listens on port {port}")
                psutil.Process(conn.pid).kill()
                return f"{tier} (pid {conn.pid})"
        raise LookupError(f"nothing listens on port {port} (tier {tier} is down)")

    return kill


def _tier_now(url: str, tier: str, key: str) -> str:
    """``tier``'s entry in the gateway's ``/admin/tiers`` (state, load), for a failure message."""
    try:
        headers = {"Authorization": f"Bearer {key}"}
        described = httpx.get(f"{url}/admin/tiers", headers=headers, timeout=10).json()
        return json.dumps(described["tiers"][tier], default=str)[:1500]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        return f"(/admin/tiers: {exc})"


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
            "| seconds | requests sent | lost | statuses | gateway RSS start MB | end MB | reset "
            "| kills |",
            "|---|---|---|---|---|---|---|---|",
            f"| {result.seconds:.0f} | {result.sent} | {result.lost} | {statuses} | "
            f"{result.rss_start_mb:.1f} | {result.rss_end_mb:.1f} | {result.reset_outcome} | "
            f"{', '.join(result.kills) or 'none'} |",
        ]
    )
