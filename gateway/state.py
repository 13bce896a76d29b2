"""Typed access to what ``create_app`` keeps on ``app.state``."""

from __future__ import annotations

from starlette.requests import Request

from gateway.config import GatewayConfig
from gateway.upstream import Upstream


def get_config(request: Request) -> GatewayConfig:
    """The app's ``GatewayConfig``."""
    config = request.app.state.config
    if not isinstance(config, GatewayConfig):
        raise RuntimeError("app.state.config is not set: build the app with gateway.create_app")
    return config


def get_upstream(request: Request) -> Upstream:
    """The app's ``Upstream`` (exists while the lifespan runs)."""
    upstream = getattr(request.app.state, "upstream", None)
    if not isinstance(upstream, Upstream):
        raise RuntimeError("app.state.upstream is not set: the gateway lifespan has not run")
    return upstream
