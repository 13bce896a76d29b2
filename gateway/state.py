"""Typed access to what ``create_app`` keeps on ``app.state``."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request

from gateway.config import GatewayConfig
from gateway.tiers import TierStates
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


def get_tier_states(request: Request) -> Mapping[str, str] | None:
    """The tiers' current states, when a supervisor publishes them (else ``None``)."""
    source: TierStates | None = getattr(request.app.state, "tier_states", None)
    return dict(source()) if source is not None else None
