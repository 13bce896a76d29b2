"""The OpenAI-compatible gateway in front of the precision tiers."""

from gateway.app import create_app, serve
from gateway.config import GatewayConfig, TierEndpoint, load_config

__all__ = ["GatewayConfig", "TierEndpoint", "create_app", "load_config", "serve"]
