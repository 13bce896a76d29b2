"""Routes on live figures: each tier's per-token time as its real traffic finds it now, against
the calibration's (the policy's ``live_routes``; what and why: gateway/policy/live.py).

``live_factor`` is pure: a tier's streamed answers (gateway/control/live_figures.py ``Sample``)
and its calibration's per-token time alone → the factor its figures are scaled by, or ``None``
(too few answers: its calibration stands). ``LiveRoutes`` is the loop every replica runs
(live figures are each replica's own): every ``interval_s`` seconds it computes the factors
and, when they differ from those the routes were derived on, hands them to the policy store
(``PolicyStore.relive``), which derives the routes again with hysteresis; a route that moves
is logged and counted as any route change (its reason names the factors).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import anyio

from gateway.control.live_figures import Sample, median_stat
from gateway.policy.derive import TierFigures
from gateway.policy.live import LiveRoutesPolicy
from gateway.policy.store import PolicyStore
from gateway.runtime import Runtime

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveFactor:
    """A tier's live per-token time over its calibration's, from ``n`` answers."""

    factor: float  # 1.0: the calibration lies inside the live median's interval
    median_s: float
    n: int
    recent: bool  # from the last ``recent_s``; False: held from older answers

    def describe(self, tier: str) -> str:
        when = "now" if self.recent else "held"
        return (
            f"{tier} x{self.factor:.2f} ({self.median_s * 1000:.1f} ms/token, n={self.n}, {when})"
        )


def live_factor(
    samples: Iterable[Sample], calibration_tpot: float, now: float, settings: LiveRoutesPolicy
) -> LiveFactor | None:
    """The factor for one tier (gateway/policy/live.py): its streamed answers of the last
    ``recent_s`` seconds, or else of the last ``hold_s``, at least ``min_samples`` of them."""
    streamed = [(s.at, s.tpot) for s in samples if s.tpot is not None and s.tpot > 0]
    if calibration_tpot <= 0:
        return None
    for since, recent in ((settings.recent_s, True), (settings.hold_s, False)):
        values = [tpot for at, tpot in streamed if now - at <= since]
        if len(values) < settings.min_samples:
            continue
        stat = median_stat(values)
        if stat is None:
            continue
        low, high = stat.low, stat.high
        if low is not None and high is not None and low <= calibration_tpot <= high:
            return LiveFactor(1.0, stat.median, stat.n, recent)  # no real difference
        return LiveFactor(stat.median / calibration_tpot, stat.median, stat.n, recent)
    return None


def live_factors(
    windows: Mapping[str, Iterable[Sample]],
    figures: Mapping[str, TierFigures],
    now: float,
    settings: LiveRoutesPolicy,
) -> dict[str, LiveFactor]:
    """Every measured tier's factor where its traffic gives one."""
    out = {}
    for name, measured in figures.items():
        found = live_factor(windows.get(name, ()), measured.tpot_s, now, settings)
        if found is not None:
            out[name] = found
    return out


def rounded(factors: Mapping[str, LiveFactor]) -> dict[str, float]:
    """The factors as the store takes them: two decimals, the ones that change nothing left out
    (so a wobble in the third decimal does not derive the routes again)."""
    return {
        name: round(f.factor, 2) for name, f in sorted(factors.items()) if round(f.factor, 2) != 1.0
    }


class LiveRoutes:
    """The loop (see the module docstring); ``clock`` is the live figures' (monotonic)."""

    def __init__(self, runtime: Runtime, clock: Callable[[], float] | None = None) -> None:
        self.runtime = runtime
        self.clock = clock or runtime.live.clock

    async def run(self) -> None:
        while True:
            settings = self.runtime.policies.active.policy.live_routes
            try:
                await self.tick()
            except Exception:
                logger.exception("live routes: a look failed")
            await anyio.sleep(settings.interval_s)

    async def tick(self) -> bool:
        """One look; True when the routes were derived again."""
        store = self.runtime.policies
        settings = store.active.policy.live_routes
        if not isinstance(store, PolicyStore) or not store.measured:
            return False
        if not settings.enabled:
            if store.factors:  # turned off: back to the calibration's figures
                return await store.relive({}, "live routes turned off")
            return False
        found = live_factors(self.runtime.live.windows(), store.measured, self.clock(), settings)
        factors = rounded(found)
        if factors == store.factors:
            return False
        why = "live figures: " + (
            ", ".join(found[name].describe(name) for name in factors) or "every tier as calibrated"
        )
        logger.info("live routes: deriving again (%s)", why)
        return await store.relive(factors, why)
