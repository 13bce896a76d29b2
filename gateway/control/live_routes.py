"""Routes on live figures: each tier's per-token time as its real traffic finds it now, against
the calibration's (the policy's ``live_routes``; what and why: gateway/policy/live.py).

``live_factor`` is pure: a tier's streamed answers (gateway/control/live_figures.py ``Sample``)
and its calibration's per-token time at each load (``LoadCurve``: alone, and at the
calibration's concurrency) → the factor its figures are scaled by, or ``None`` (too few
answers: its calibration stands). ``LiveRoutes`` is the loop every replica runs
(live figures are each replica's own): every ``interval_s`` seconds it computes the factors
and, when they differ from those the routes were derived on, hands them to the policy store
(``PolicyStore.relive``), which derives the routes again with hysteresis; a route that moves
is logged and counted as any route change (its reason names the factors). A tier the routes
moved away from is probed before the factors are computed, when due
(gateway/control/live_probes.py): that is how its recovery shows.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import anyio

from backends.tier_state import TierState
from gateway.control.live_figures import Answered, Sample, median_stat
from gateway.control.live_probes import probe_tier, probes_due
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


@dataclass(frozen=True)
class LoadCurve:
    """A tier's calibrated per-token time at a load: ``alone`` (one request) and, from the
    calibration's throughput at ``concurrency`` requests at once, ``concurrency / throughput``
    per request there; straight between, and growing with the load past it (saturated)."""

    alone: float
    loaded: float | None = None  # per-token time of one of ``concurrency`` requests at once
    concurrency: int = 1

    @classmethod
    def of(cls, figures: TierFigures) -> LoadCurve:
        if figures.concurrency <= 1 or figures.throughput_tok_s <= 0:
            return cls(figures.tpot_s)
        loaded = max(figures.concurrency / figures.throughput_tok_s, figures.tpot_s)
        return cls(figures.tpot_s, loaded, figures.concurrency)

    def at(self, load: int) -> float:
        if self.loaded is None or load <= 1:
            return self.alone
        if load <= self.concurrency:
            share = (load - 1) / (self.concurrency - 1)
            return self.alone + (self.loaded - self.alone) * share
        return self.loaded * load / self.concurrency


def live_factor(
    samples: Iterable[Sample], curve: LoadCurve, now: float, settings: LiveRoutesPolicy
) -> LiveFactor | None:
    """The factor for one tier (gateway/policy/live.py): its streamed answers of the last
    ``recent_s`` seconds, or else of the last ``hold_s``, at least ``min_samples`` of them,
    each over the calibration's per-token time at the load it was sent under (so a tier that
    is only busy, as busy as calibrated, keeps factor 1)."""
    if curve.alone <= 0:
        return None
    streamed = [(s.at, s.tpot, s.load) for s in samples if s.tpot is not None and s.tpot > 0]
    for since, recent in ((settings.recent_s, True), (settings.hold_s, False)):
        kept = [(tpot, load) for at, tpot, load in streamed if now - at <= since]
        if len(kept) < settings.min_samples:
            continue
        ratios = median_stat([tpot / curve.at(load) for tpot, load in kept])
        raw = median_stat([tpot for tpot, _ in kept])
        if ratios is None or raw is None:
            continue
        if ratios.low is not None and ratios.high is not None and ratios.low <= 1 <= ratios.high:
            return LiveFactor(1.0, raw.median, raw.n, recent)  # no real difference
        return LiveFactor(ratios.median, raw.median, raw.n, recent)
    return None


def live_factors(
    windows: Mapping[str, Iterable[Sample]],
    figures: Mapping[str, TierFigures],
    now: float,
    settings: LiveRoutesPolicy,
    since: Mapping[str, float] | None = None,
) -> dict[str, LiveFactor]:
    """Every measured tier's factor where its traffic gives one (a tier in ``since``: from its
    answers at or after that time on, its last good probe)."""
    out = {}
    for name, measured in figures.items():
        start = (since or {}).get(name, float("-inf"))
        samples = [s for s in windows.get(name, ()) if s.at >= start]
        found = live_factor(samples, LoadCurve.of(measured), now, settings)
        if found is not None:
            out[name] = found
    return out


def relative_to_host(found: Mapping[str, LiveFactor]) -> tuple[dict[str, LiveFactor], float]:
    """Tiers that share one host's cores slow each other: when two or more have recent answers,
    the median of their factors is the host's, and each recent factor is taken relative to it
    (a tier is slow only against the others under the same load). Held factors, from older
    answers, stay as they are. Returns the factors and the host's (1: fewer than two)."""
    recent = [f.factor for f in found.values() if f.recent]
    stat = median_stat(recent) if len(recent) >= 2 else None
    if stat is None:
        return dict(found), 1.0
    host = stat.median
    out = {
        name: dataclasses.replace(f, factor=f.factor / host) if f.recent else f
        for name, f in found.items()
    }
    return out, host


def rounded(factors: Mapping[str, LiveFactor], tolerance: float = 0.0) -> dict[str, float]:
    """The factors as the store takes them: two decimals, those within ``tolerance`` of 1 left
    out (a few hundred answers make an interval narrow enough that a 3 % wobble is
    'significant': it would derive the routes again at every look, moving nothing)."""
    return {
        name: round(f.factor, 2)
        for name, f in sorted(factors.items())
        if abs(round(f.factor, 2) - 1.0) > tolerance
    }


Prober = Callable[[str, LiveRoutesPolicy], Awaitable[list[Answered]]]


class LiveRoutes:
    """The loop (see the module docstring); ``clock`` is the live figures' (monotonic);
    ``prober`` sends a tier its probes (default: ``probe_tier`` on its first ready endpoint)."""

    def __init__(
        self,
        runtime: Runtime,
        clock: Callable[[], float] | None = None,
        prober: Prober | None = None,
    ) -> None:
        self.runtime = runtime
        self.clock = clock or runtime.live.clock
        self.prober = prober or self._probe
        self.last_probe: dict[str, float] = {}  # when each tier was last probed
        self.probed: dict[str, float] = {}  # when each tier's last good probe began

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
        self._show(store)
        windows = self.runtime.live.windows()
        latest = {tier: max(s.at for s in kept) for tier, kept in windows.items() if kept}
        due = probes_due(store.factors, latest, self.last_probe, self.clock(), settings)
        if due:
            await self._send_probes(due, settings)
            windows = self.runtime.live.windows()
        now, probed, measured = self.clock(), dict(self.probed), store.measured
        # Off the event loop: over 3 tiers' 512 answers a look took 5.6 ms of CPU here.
        found = await anyio.to_thread.run_sync(
            lambda: live_factors(windows, measured, now, settings, probed)
        )
        host = 1.0
        if settings.shared_host:
            found, host = relative_to_host(found)
        factors = rounded(found, settings.tolerance)
        if factors == store.factors:
            return False
        why = "live figures: " + (
            ", ".join(found[name].describe(name) for name in factors) or "every tier as calibrated"
        )
        if host != 1.0:
            why += f"; relative to the host's x{host:.2f} (the busy tiers' median)"
        logger.info("live routes: deriving again (%s)", why)
        changed = await store.relive(factors, why)
        self._show(store)
        return changed

    def _show(self, store: PolicyStore) -> None:
        for tier in store.measured:
            self.runtime.metrics.live_factor.labels(tier).set(store.factors.get(tier, 1.0))

    async def _send_probes(self, tiers: list[str], settings: LiveRoutesPolicy) -> None:
        for tier in tiers:
            began = self.last_probe[tier] = self.clock()
            try:
                answers = await self.prober(tier, settings)
            except Exception as exc:  # a tier that does not answer: nothing learnt
                logger.warning("live routes: probing %s failed: %s", tier, exc)
                self.runtime.metrics.live_probes.labels(tier, "failed").inc()
                continue
            for answer in answers:
                self.runtime.live.observe(answer)
            judged = len(answers) >= settings.min_samples
            if judged:
                self.probed[tier] = began
            self.runtime.metrics.live_probes.labels(tier, "judged" if judged else "short").inc()
            logger.info("live routes: probed %s (%d answers)", tier, len(answers))

    async def _probe(self, tier: str, settings: LiveRoutesPolicy) -> list[Answered]:
        board = self.runtime.board
        ready = [u for u in board.pool(tier) if board.endpoint_state(tier, u) == TierState.READY]
        if not ready:
            return []
        return await probe_tier(tier, ready[0], board.tiers[tier].api_key, settings)
