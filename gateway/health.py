"""Liveness (``/healthz``: the runtime is up) and readiness (``/readyz``: some tier answers
``/health`` with 200)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.config import TierEndpoint
from gateway.errors import SERVER_ERROR, APIError, error_response
from gateway.request.upstream import Upstream, UpstreamTimeout, UpstreamUnavailable, aclose_quietly
from gateway.runtime import Runtime, get_config, get_upstream


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
    """200 with each tier's state if at least one tier is healthy, else 503."""
    config = get_config(request)
    upstream = get_upstream(request)
    states = await asyncio.gather(
        *(probe_tier(upstream, tier, config.connect_timeout) for tier in config.tiers)
    )
    tiers = {tier.name: state for tier, state in zip(config.tiers, states, strict=True)}
    if "ok" in states:
        return JSONResponse({"status": "ready", "tiers": tiers})
    summary = ", ".join(f"{name} {state}" for name, state in tiers.items())
    return error_response(503, f"no tier is ready ({summary})", SERVER_ERROR, code="not_ready")
