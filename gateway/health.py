"""Liveness (``/healthz``: the runtime is up) and readiness (``/readyz``: some tier answers
``/health`` with 200 and the router would send it requests)."""

from __future__ import annotations

import asyncio

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from backends.tier_state import TierState
from gateway.config import TierEndpoint
from gateway.control.tier_status import scrape_pools
from gateway.errors import SERVER_ERROR, APIError, error_response
from gateway.request.upstream import Upstream, UpstreamTimeout, UpstreamUnavailable, aclose_quietly
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


async def readyz(request: Request) -> Response:
    """200 with each tier's state if at least one tier is healthy and routed, else 503.

    Each tier's ``/health`` is probed now. A tier that answers but that the router still holds
    down from its last scrape (it came up after the gateway, say) is scraped again at once,
    within ``connect_timeout`` in all, so that "ready" means a request would be routed rather
    than answered 503 until the next scrape. A tier held out by a mark (a KV-pool reset) or by
    its supervisor is reported as such, not scraped, and not counted."""
    runtime = get_runtime(request)
    config = runtime.config
    states = await asyncio.gather(
        *(probe_tier(runtime.upstream, tier, config.connect_timeout) for tier in config.tiers)
    )
    tiers = {tier.name: state for tier, state in zip(config.tiers, states, strict=True)}
    stale = [
        name
        for name, state in tiers.items()
        if state == "ok" and runtime.board.state(name) == TierState.DOWN
    ]
    if stale:
        with anyio.move_on_after(config.connect_timeout):
            upstream, board = runtime.upstream, runtime.board
            await scrape_pools(upstream, board, stale, config.model_name, config.connect_timeout)
    for name, state in tiers.items():
        held = runtime.board.state(name)
        if state == "ok" and held != TierState.READY:
            tiers[name] = f"ok, not routed ({held})"
    if "ok" in tiers.values():
        return JSONResponse({"status": "ready", "tiers": tiers})
    summary = ", ".join(f"{name} {state}" for name, state in tiers.items())
    return error_response(503, f"no tier is ready ({summary})", SERVER_ERROR, code="not_ready")
