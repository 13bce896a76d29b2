"""Resetting a tier that is a pool: one endpoint at a time, never the last ready one.

A tier of one endpoint is reset as a whole (gateway/control/resets.py: drained out of routing,
its class safety checked by gateway/control/reset_schedule.py). A pool (gateway/config.py:
``endpoints`` or ``dns``) stays in routing while it is reset: ``roll_pool`` walks its
endpoints in pool order and, for each,

1. asks ``next_endpoint`` (pure) which endpoint is next: the first ready one not yet reset,
   and only while another endpoint of the tier stays ready (the last ready endpoint of a tier
   is never drained; the roll stops there and says so);
2. marks it ``draining`` for every replica (an endpoint mark, gateway/control/reset_marks.py),
   so the endpoint choice (gateway/request/route/endpoint_choice.py) sends its sessions to the
   others;
3. waits one scrape interval, then until the endpoint's own scraped counts (vLLM's running and
   waiting requests, across every replica) reach zero, at most the drain timeout (past it the
   endpoint is skipped, not reset);
4. marks it ``resetting``, resets its KV pool and warms it up (backends/client.py), and lifts
   the mark.

The outcome is the worst of the endpoints' (failed > gave_up > unverified > ok) with one
detail per endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

import anyio

from backends.client import TierClient, TierClientError
from backends.tier_state import TierState
from gateway.control.tier_status import TierBoard
from gateway.request.route.endpoint_choice import EndpointStatus

_WORST = ("ok", "unverified", "gave_up", "failed")


@dataclass(frozen=True)
class PoolStep:
    """The endpoint to reset next (``None``: the roll is over) and why."""

    endpoint: str | None
    reason: str


def next_endpoint(endpoints: Sequence[EndpointStatus], done: Collection[str]) -> PoolStep:
    """The first ready endpoint not in ``done``, when another endpoint stays ready."""
    ready = [e.url for e in endpoints if e.state == TierState.READY]
    todo = [url for url in ready if url not in done]
    if not todo:
        return PoolStep(None, "every ready endpoint is reset" if done else "no endpoint is ready")
    if len(ready) < 2:
        return PoolStep(None, f"{todo[0]} is the last ready endpoint of the tier")
    return PoolStep(todo[0], f"{len(ready) - 1} other endpoint(s) ready")


def drained(endpoint: EndpointStatus) -> bool:
    """No request running or waiting on the endpoint at its last scrape."""
    return endpoint.requests_running <= 0 and endpoint.requests_waiting <= 0


Mark = Callable[[str, TierState | None], Awaitable[None]]


@dataclass(frozen=True)
class RollSettings:
    settle: float  # seconds for every replica to see a mark (one scrape interval)
    drain_timeout: float
    model: str
    poll: float = 0.2


async def roll_pool(
    board: TierBoard,
    tier: str,
    mark: Mark,
    client_for: Callable[[str], TierClient],
    settings: RollSettings,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[str, str]:
    """Reset the endpoints of ``tier`` one at a time (see the module docstring); returns the
    outcome and its detail. Every mark it set is lifted, however it ends."""
    done: list[str] = []
    results: list[tuple[str, str, str]] = []  # (url, outcome, detail)
    while True:
        step = next_endpoint(board.endpoint_statuses(tier), done)
        if step.endpoint is None:
            break
        url = step.endpoint
        done.append(url)
        try:
            results.append((url, *await _reset_one(board, tier, url, mark, client_for(url),
                                                   settings, clock)))  # fmt: skip
        finally:
            with anyio.CancelScope(shield=True):
                await mark(url, None)
    if not results:
        return "gave_up", step.reason
    outcome = max((o for _, o, _ in results), key=_WORST.index)
    detail = "; ".join(f"{url}: {o} ({d})" for url, o, d in results)
    stopped = "" if step.reason.startswith("every") else f"; stopped: {step.reason}"
    return outcome, detail + stopped


async def _reset_one(
    board: TierBoard,
    tier: str,
    url: str,
    mark: Mark,
    client: TierClient,
    settings: RollSettings,
    clock: Callable[[], float],
) -> tuple[str, str]:
    await mark(url, TierState.DRAINING)
    await anyio.sleep(settings.settle)
    deadline = clock() + settings.drain_timeout
    while not drained(_status(board, tier, url)):
        if clock() > deadline:
            return "gave_up", "requests still running after the drain timeout"
        await anyio.sleep(settings.poll)
    await mark(url, TierState.RESETTING)
    try:
        result = await client.reset_kv_pool(verify=True)
        await client.warm_up(settings.model, requests=1)
    except TierClientError as exc:
        return "failed", str(exc)
    return ("ok" if result.verified else "unverified"), result.detail


def _status(board: TierBoard, tier: str, url: str) -> EndpointStatus:
    found = [e for e in board.endpoint_statuses(tier) if e.url == url]
    return found[0] if found else EndpointStatus(url, TierState.DOWN)
