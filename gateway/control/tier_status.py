"""What the gateway knows about each tier: its state and its last scraped load.

``TierBoard`` merges two sources into the router's ``TierStatus`` values:
- the supervisor's ``TierState`` (backends/tier_state.py) when the gateway runs beside it
  (``supervisor_states``), or a reset's ``draining``/``resetting`` mark (``set_state``);
- the tier's own ``/metrics`` (vLLM's Prometheus text, parsed by backends/metrics.py): queue
  depth and KV-cache usage for saturation, scraped every ``metrics_interval`` seconds. A tier
  without ``/metrics`` is probed at ``/health``; a tier that answers neither is ``down``.

``scrape_tier`` does the I/O for one tier; ``TierBoard.record`` and ``statuses`` are pure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from backends.metrics import MetricsParseError, TierMetrics, parse_metrics
from backends.tier_state import TierState
from gateway.config import TierEndpoint
from gateway.control.live_guard import LiveGuard
from gateway.errors import APIError
from gateway.policy.schema import CLASS_NAMES
from gateway.request.router import TierStatus
from gateway.request.upstream import Upstream, aclose_quietly

# Each tier's state as its supervisor sees it (backends/supervisor.py ``Supervisor.states``).
SupervisorStates = Callable[[], Mapping[str, TierState]]


@dataclass(frozen=True)
class Scrape:
    """One look at a tier: did it answer, and its metrics when it has them."""

    healthy: bool
    metrics: TierMetrics | None
    at: float
    error: str | None = None


class TierBoard:
    """The latest known status of each configured tier."""

    def __init__(
        self,
        tiers: Sequence[TierEndpoint],
        supervisor_states: SupervisorStates | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tiers = {tier.name: tier for tier in tiers}
        self._supervisor_states = supervisor_states
        self._clock = clock
        self._scrapes: dict[str, Scrape] = {}
        self._marks: dict[str, TierState] = {}  # the reset coordinator's, e.g. draining
        self.guard = LiveGuard()  # classes shadow comparisons withheld from a tier

    def record(self, name: str, scrape: Scrape) -> None:
        self._scrapes[name] = scrape

    def set_state(self, name: str, state: TierState | None) -> None:
        """Override a tier's state (``draining``, ``resetting``); ``None`` lifts it."""
        if state is None:
            self._marks.pop(name, None)
        else:
            self._marks[name] = state

    def state(self, name: str) -> TierState:
        """A mark wins, then a supervisor state other than ready, then the last scrape."""
        if name in self._marks:
            return self._marks[name]
        if self._supervisor_states is not None:
            supervised = self._supervisor_states().get(name, TierState.DOWN)
            if supervised != TierState.READY:
                return supervised
        scrape = self._scrapes.get(name)
        return TierState.READY if scrape is None or scrape.healthy else TierState.DOWN

    def metrics(self, name: str) -> TierMetrics | None:
        """The tier's last scraped metrics (``None``: none yet)."""
        scrape = self._scrapes.get(name)
        return scrape.metrics if scrape is not None else None

    def statuses(self) -> dict[str, TierStatus]:
        """Every configured tier's ``TierStatus``, in configuration order."""
        out: dict[str, TierStatus] = {}
        for name, tier in self.tiers.items():
            scrape = self._scrapes.get(name)
            metrics = scrape.metrics if scrape is not None else None
            out[name] = TierStatus(
                name=name,
                state=self.state(name),
                requests_waiting=metrics.requests_waiting if metrics else 0.0,
                kv_usage=metrics.kv_cache_usage if metrics else 0.0,
                max_model_len=tier.max_model_len,
                classes=self._classes(name),
            )
        return out

    def _classes(self, name: str) -> frozenset[str] | None:
        """What the admission check admitted, less what the live guard withholds."""
        admitted = self.tiers[name].classes
        withheld = self.guard.classes_withheld(name)
        if not withheld:
            return frozenset(admitted) if admitted is not None else None
        return frozenset(admitted if admitted is not None else CLASS_NAMES) - withheld

    def describe(self) -> dict[str, dict[str, object]]:
        """For ``/admin/tiers``: state, last scrape and load of each tier."""
        now = self._clock()
        out: dict[str, dict[str, object]] = {}
        for name, tier in self.tiers.items():
            scrape = self._scrapes.get(name)
            metrics = scrape.metrics if scrape is not None else None
            out[name] = {
                "state": self.state(name),
                "base_url": tier.base_url,
                "max_model_len": tier.max_model_len,
                "classes": tier.classes,
                "withheld": sorted(self.guard.classes_withheld(name)),
                "admission": tier.admission,
                "scraped_seconds_ago": round(now - scrape.at, 1) if scrape else None,
                "scrape_error": scrape.error if scrape else None,
                "requests_running": metrics.requests_running if metrics else None,
                "requests_waiting": metrics.requests_waiting if metrics else None,
                "kv_cache_usage": metrics.kv_cache_usage if metrics else None,
                "preemptions": metrics.preemptions if metrics else None,
            }
        return out


async def scrape_tier(
    upstream: Upstream, tier: TierEndpoint, model_name: str, timeout: float, now: float
) -> Scrape:
    """``/metrics`` of one tier, falling back to ``/health``; never raises."""
    error: str | None = None
    answer = await _get(upstream, tier, "/metrics", timeout)
    if isinstance(answer, tuple) and answer[0] == 200:
        try:
            return Scrape(True, parse_metrics(answer[1], model_name), now)
        except MetricsParseError as exc:
            error = str(exc)
    health = await _get(upstream, tier, "/health", timeout)
    if isinstance(health, tuple) and health[0] == 200:
        return Scrape(True, None, now, error)
    why = health if isinstance(health, str) else f"/health answered {health[0]}"
    return Scrape(False, None, now, why)


async def _get(
    upstream: Upstream, tier: TierEndpoint, path: str, timeout: float
) -> tuple[int, str] | str:
    try:
        response = await upstream.send(tier, "GET", path, timeout=timeout, quiet=True)
    except APIError as exc:
        return exc.message
    try:
        raw = await upstream.read(tier, response)
    except APIError as exc:
        return exc.message
    finally:
        await aclose_quietly(response)
    return response.status_code, raw.decode("utf-8", "replace")
