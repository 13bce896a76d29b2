"""``create_app(config)``: the gateway's Starlette app, and ``serve`` to run it with uvicorn."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Route

from gateway.config import GatewayConfig
from gateway.errors import exception_handlers
from gateway.health import healthz, readyz
from gateway.proxy import chat_completions, completions, list_models
from gateway.tiers import TierStates
from gateway.upstream import Upstream


def create_app(config: GatewayConfig, tier_states: TierStates | None = None) -> Starlette:
    """Build the app; its lifespan owns the one shared ``httpx.AsyncClient``.

    ``tier_states`` returns each tier's state as its supervisor sees it; without it, every
    configured tier is a candidate.
    """

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        timeout = httpx.Timeout(config.read_timeout, connect=config.connect_timeout)
        # No pool cap: admission control belongs to the router, not to a hidden pool limit.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=20)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
            app.state.upstream = Upstream(client)
            try:
                yield
            finally:
                del app.state.upstream

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers=exception_handlers(), lifespan=lifespan)
    app.state.config = config
    app.state.tier_states = tier_states
    return app


def serve(
    config: GatewayConfig, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"
) -> None:
    """Run the gateway with uvicorn until interrupted (binds loopback unless told otherwise)."""
    uvicorn.run(create_app(config), host=host, port=port, log_level=log_level, lifespan="on")
