"""How sure a measured speed gain is: a paired bootstrap interval over the calibration's
interleaved per-prompt samples (pure).

The speed calibration (measure/speed.py) sends prompt i to every tier, back to back, before any
tier gets prompt i + 1. Each prompt therefore gives one *pair* of costs measured under nearly
the same machine load, and a tier's gain over another is judged on the pairs, not on two
medians taken seconds apart: ``r_i = cost_tier_i / cost_other_i`` (the machine's load at that
moment cancels in the ratio), and the gain is ``1 - exp(mean(log r_i))``, one minus the
geometric mean ratio (a ratio's natural mean: 2x slower and 2x faster cancel).

Why a bootstrap: the samples are few (8 prompts by default), the statistic is a ratio, and
costs on a shared machine are skewed with load spikes, far from normal, so neither a t
interval nor a normal approximation of the ratio is trustworthy. The percentile bootstrap
assumes none of that: it resamples the prompts (with replacement; both tiers' costs of a prompt
travel together, which keeps the pairing) and takes the statistic's quantiles. At n = 8 it is
still a little narrow (percentile intervals under-cover at small n), which is why the rule it
feeds also demands a ``min_gain`` margin. The random generator is seeded: the same samples
always give the same interval, so a route derived twice from the same figures is the same.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

RESAMPLES = 2000  # bootstrap resamples: the quantiles' own noise is ~0.5 % of the width
SEED = 0
MIN_PAIRS = 4  # fewer pairs than this: no interval (the rule falls back to the point figures)


@dataclass(frozen=True)
class GainInterval:
    """A tier's gain over another (``1 - cost_tier / cost_other``), with its interval."""

    gain: float  # the statistic on all pairs
    low: float
    high: float
    n: int  # pairs used
    level: float  # the interval's confidence, e.g. 0.95

    def describe(self, other: str) -> str:
        """``gain 0.42 [0.35, 0.49] over fp16, n=8``."""
        return f"gain {self.gain:.2f} [{self.low:.2f}, {self.high:.2f}] over {other}, n={self.n}"


def answer_costs(
    ttfts: Sequence[float | None], tpots: Sequence[float | None], answer_tokens: int
) -> tuple[float | None, ...]:
    """Per prompt, the seconds of one ``answer_tokens`` answer alone: ``ttft + tokens x tpot``
    (``None`` where the prompt's request failed or its samples are missing)."""
    out: list[float | None] = []
    for i, ttft in enumerate(ttfts):
        tpot = tpots[i] if i < len(tpots) else None
        out.append(None if ttft is None or tpot is None else ttft + answer_tokens * tpot)
    return tuple(out)


def paired_gain(
    tier: Sequence[float | None],
    other: Sequence[float | None],
    level: float,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> GainInterval | None:
    """``tier``'s gain over ``other`` from per-prompt costs (same prompt, same index), with a
    ``level`` percentile bootstrap interval; ``None`` with fewer than ``MIN_PAIRS`` usable
    pairs (both costs present and positive)."""
    logs = tuple(
        math.log(a / b)
        for a, b in zip(tier, other, strict=False)
        if a is not None and b is not None and a > 0 and b > 0
    )
    if len(logs) < MIN_PAIRS:
        return None
    if not 0 < level < 1:
        raise ValueError(f"confidence level must be in (0, 1), not {level}")
    return _interval(logs, level, resamples, seed)


@lru_cache(maxsize=256)
def _interval(logs: tuple[float, ...], level: float, resamples: int, seed: int) -> GainInterval:
    n = len(logs)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(logs, k=n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    low_mean = means[max(0, math.floor(tail * resamples))]
    high_mean = means[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]
    # The gain falls as the mean log ratio rises: the interval's ends swap.
    return GainInterval(
        gain=1 - math.exp(sum(logs) / n),
        low=1 - math.exp(high_mean),
        high=1 - math.exp(low_mean),
        n=n,
        level=level,
    )
