"""Liveness (``/healthz``: the runtime is up) and readiness (``/readyz``: some tier answers
``/health`` with 200 and the router would send it requests)."""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from backends.tier_state import TierState
from gateway.config import TierEndpoint
from gateway.control.tier_status import scrape_pools
from gateway.errors import SERVER_ERROR, APIError, error_response
from gateway.request.upstream.client import (
    Upstream,
    UpstreamTimeout,
    UpstreamUnavailable,
    aclose_quietly,
)
from gateway.runtime import Runtime, get_runtime


async def healthz(request: Request) -> Response:
    """200 while the runtime (the lifespan's client, shared state and background loops) is up;
    503 when it is not (never started, or its lifespan ended: then every /v1 request would fail
    and the process needs a restart). Says nothing about tiers."""
    if not isinstance(getattr(request.app.state, "runtime", None), Runtime):
        message = "the gateway's runtime is not running (its lifespan ended); restart the process"
        return error_response(503, message, SERVER_ERROR, code="not_alive")
    return JSONResponse({"status": "ok"})


async def probe_tier(upstream: Upstream, tier: TierEndpoint, timeout: float) -> str:
    """``"ok"`` if the tier's ``/health`` answers 200, else a short reason."""
    try:
        response = await upstream.send(tier, "GET", "/health", timeout=timeout)
    except UpstreamUnavailable:
        return "unreachable"
    except UpstreamTimeout:
        return "timed out"
    except APIError:
        return "failed"
    await aclose_quietly(response)
    return "ok" if response.status_code == 200 else f"answered {response.status_code}"


NOT_WAITED = "not waited for"  # another tier was found ready first
TIMED_OUT = "timed out"


async def readyz(request: Request) -> Response:
    """200 as soon as one tier is healthy and routed, else 503 within ``readiness_timeout``.

    Every tier's ``/health`` is probed at once; the first tier found healthy and routed
    answers the probe and the other checks are cancelled (reported ``not waited for``): one
    hung tier, or a dead pod's address still in DNS, never makes the gateway look unready
    while it could route around it. With no such tier within ``readiness_timeout`` (2 s,
    below the Deployment probe's 3 s timeout) the answer is 503, the tiers still silent
    reported ``timed out``. A tier that answers but that the router still holds down from its
    last scrape (it came up after the gateway, say) is scraped again at once, so that "ready"
    means a request would be routed rather than answered 503 until the next scrape. A tier
    held out by a mark (a KV-pool reset) or by its supervisor is reported as such, not
    scraped, and not counted."""
    runtime = get_runtime(request)
    config = runtime.config
    tiers = dict.fromkeys((tier.name for tier in config.tiers), "")
    with anyio.move_on_after(config.readiness_timeout):
        async with anyio.create_task_group() as group:
            for tier in config.tiers:
                group.start_soon(_check, runtime, tier, tiers, group.cancel_scope)
    ready = "ok" in tiers.values()
    unfinished = NOT_WAITED if ready else TIMED_OUT
    tiers = {name: state or unfinished for name, state in tiers.items()}
    if ready:
        return JSONResponse({"status": "ready", "tiers": tiers})
    summary = ", ".join(f"{name} {state}" for name, state in tiers.items())
    return error_response(503, f"no tier is ready ({summary})", SERVER_ERROR, code="not_ready")


async def _check(
    runtime: Runtime, tier: TierEndpoint, tiers: dict[str, str], found: anyio.CancelScope
) -> None:
    """Record ``tier``'s state in ``tiers``; ``ok`` (healthy and routed) cancels ``found``."""
    config, board = runtime.config, runtime.board
    timeout = config.readiness_timeout
    state = await probe_tier(runtime.upstream, tier, timeout)
    if state == "ok" and board.state(tier.name) == TierState.DOWN:
        await scrape_pools(runtime.upstream, board, [tier.name], config.model_name, timeout)
    held = board.state(tier.name)
    if state == "ok" and held != TierState.READY:
        state = f"ok, not routed ({held})"
    tiers[tier.name] = state
    if state == "ok":
        found.cancel()
