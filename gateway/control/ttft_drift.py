"""TTFT drift per tier, for the reset trigger ``triggers.ttft_p90_factor`` (no I/O, no clock).

vLLM exports time to first token as a cumulative histogram. ``TtftDrift`` keeps a snapshot of
each tier's buckets every ``every`` seconds and answers two p90s from bucket differences:

- recent: the TTFTs of the last ``window`` seconds;
- baseline: the TTFTs of the first ``window`` seconds after the tier's last reset (or after the
  tracker first saw the tier), frozen once that window has passed.

Both are ``None`` until there are observations to compute them from. The state lives in the
leading replica's memory: a new leader starts a fresh baseline.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from backends.metrics import histogram_quantile

Buckets = tuple[tuple[float, float], ...]


@dataclass
class _Tier:
    snapshots: deque[tuple[float, Buckets]] = field(default_factory=deque)
    base_from: tuple[float, Buckets] | None = None
    baseline_ms: float | None = None


class TtftDrift:
    """See the module docstring."""

    def __init__(self, window: float = 300.0, every: float = 10.0) -> None:
        self.window, self.every = window, every
        self._tiers: dict[str, _Tier] = {}

    def observe(self, tier: str, now: float, buckets: Buckets) -> None:
        """A scrape of ``tier``'s TTFT buckets at ``now`` (seconds)."""
        if not buckets:
            return
        state = self._tiers.setdefault(tier, _Tier())
        if state.base_from is None:
            state.base_from = (now, buckets)
        if not state.snapshots or now - state.snapshots[-1][0] >= self.every:
            state.snapshots.append((now, buckets))
        while len(state.snapshots) > 2 and now - state.snapshots[1][0] >= self.window:
            state.snapshots.popleft()
        start, first = state.base_from
        if state.baseline_ms is None and now - start >= self.window:
            p90 = histogram_quantile(0.9, buckets, first)
            state.baseline_ms = None if p90 is None else p90 * 1000
            if p90 is None:  # nothing served in that window: measure the next one
                state.base_from = (now, buckets)

    def reset_done(self, tier: str, now: float, buckets: Buckets) -> None:
        """The tier was just reset: a new baseline window starts."""
        self._tiers[tier] = _Tier(deque([(now, buckets)]) if buckets else deque(), None, None)
        if buckets:
            self._tiers[tier].base_from = (now, buckets)

    def recent_p90_ms(self, tier: str) -> float | None:
        state = self._tiers.get(tier)
        if state is None or len(state.snapshots) < 2:
            return None
        p90 = histogram_quantile(0.9, state.snapshots[-1][1], state.snapshots[0][1])
        return None if p90 is None else p90 * 1000

    def baseline_p90_ms(self, tier: str) -> float | None:
        state = self._tiers.get(tier)
        return state.baseline_ms if state is not None else None
