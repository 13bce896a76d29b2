"""The gateway's runtime parts, built by ``create_app``'s lifespan and kept on ``app.state``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from opentelemetry.trace import Tracer
from starlette.requests import Request

from common.class_categories import CLASS_NAMES
from gateway.config import GatewayConfig
from gateway.control.live_figures import LiveFigures
from gateway.control.shadow import ShadowSampler
from gateway.control.tier_memory import TierMemory
from gateway.control.tier_status import TierBoard
from gateway.metrics import GatewayMetrics
from gateway.policy.schema import RoutingPolicy
from gateway.policy.store import ActivePolicy
from gateway.request.tokens.prompt_count import PromptCounter
from gateway.request.upstream.client import Upstream
from gateway.request_log import RequestLog
from gateway.shared.state import SharedState


class PolicySource(Protocol):
    """Where the current routing policy comes from (gateway/policy/store.py, or a fixed one)."""

    @property
    def active(self) -> ActivePolicy: ...


@dataclass(frozen=True)
class FixedPolicy:
    """A policy that never changes: the gateway's default when no policy file is configured."""

    active: ActivePolicy


def default_policy(tiers: Sequence[str]) -> RoutingPolicy:
    """Every class tries the configured tiers in their configured order."""
    route = {"tiers": list(tiers)}
    return RoutingPolicy.model_validate(
        {"tiers": list(tiers), "routes": dict.fromkeys(CLASS_NAMES, route)}
    )


class Admission:
    """Counts the completion requests this process holds; refuses past ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.current = 0

    def enter(self) -> bool:
        if self.current >= self.limit:
            return False
        self.current += 1
        return True

    def leave(self) -> None:
        self.current = max(0, self.current - 1)


@dataclass(frozen=True)
class Runtime:
    """Everything a request handler uses; one per app, alive while the lifespan runs."""

    config: GatewayConfig
    upstream: Upstream
    policies: PolicySource
    counter: PromptCounter
    board: TierBoard
    shared: SharedState
    metrics: GatewayMetrics
    tracer: Tracer
    admission: Admission
    memory: TierMemory
    shadow: ShadowSampler
    request_log: RequestLog | None = None
    live: LiveFigures = field(default_factory=LiveFigures)  # answers' figures, per tier


def get_runtime(request: Request) -> Runtime:
    """The app's ``Runtime`` (exists while the lifespan runs)."""
    runtime = getattr(request.app.state, "runtime", None)
    if not isinstance(runtime, Runtime):
        raise RuntimeError("app.state.runtime is not set: the gateway lifespan has not run")
    return runtime
