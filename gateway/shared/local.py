"""The shared state's in-process half (gateway/shared/state.py): the same semantics as Redis,
for this replica only — in-flight counts, per-second request buckets, sliding-window rate
limits, values and lists."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

BUCKET_TTL = 310  # seconds a per-second traffic bucket is kept
# Without Redis: rate-limit windows are dropped once empty (looked for every _SWEEP_EVERY s), and
# past _MAX_LOCAL_WINDOWS the least recently used go (their limits start again).
_SWEEP_EVERY = 10.0
_MAX_LOCAL_WINDOWS = 100_000


@dataclass(frozen=True)
class RateDecision:
    """The answer of ``SharedState.rate_limit``."""

    allowed: bool
    retry_after: float  # seconds until a request would be allowed again (0 when allowed)
    remaining: int  # requests left in the current window


@dataclass
class LocalState:
    """In-process state: the same semantics as Redis, for this replica only."""

    inflight: dict[str, int] = field(default_factory=dict)
    buckets: dict[int, int] = field(default_factory=dict)
    # key id -> (its window's length, the times of its units), least recently used first
    windows: dict[str, tuple[float, deque[float]]] = field(default_factory=dict)
    swept_at: float = float("-inf")
    values: dict[str, tuple[str, float]] = field(default_factory=dict)  # name -> (value, until)
    lists: dict[str, list[str]] = field(default_factory=dict)

    def _sweep(self, now: float) -> None:
        """Drop the rate windows with nothing left in them, every ``_SWEEP_EVERY`` seconds."""
        if now < self.swept_at + _SWEEP_EVERY:
            return
        self.swept_at = now
        for key, (per, stamps) in list(self.windows.items()):
            if not stamps or stamps[-1] <= now - per:
                del self.windows[key]

    def count_request(self, second: int) -> None:
        self.buckets[second] = self.buckets.get(second, 0) + 1
        if len(self.buckets) > BUCKET_TTL:
            for old in [s for s in self.buckets if s <= second - BUCKET_TTL]:
                del self.buckets[old]

    def rate_limit(
        self, key_id: str, limit: int, per: float, now: float, cost: int = 1
    ) -> RateDecision:
        self._sweep(now)
        _, stamps = self.windows.pop(key_id, (per, deque()))  # back in, as the most recent
        self.windows[key_id] = (per, stamps)
        while len(self.windows) > _MAX_LOCAL_WINDOWS:
            del self.windows[next(iter(self.windows))]
        while stamps and stamps[0] <= now - per:
            stamps.popleft()
        if len(stamps) + cost <= limit:
            stamps.extend([now] * cost)
            return RateDecision(True, 0.0, limit - len(stamps))
        return RateDecision(False, stamps[len(stamps) + cost - limit - 1] + per - now, 0)
