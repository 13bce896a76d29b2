"""Live figures: each tier's TTFT and per-token time as real traffic finds them (pure summary
over a small holder).

Every answer the gateway relays ends in ``Exchange._finish`` (gateway/request/exchange.py),
which hands an ``Answered`` to ``LiveFigures.observe``: an append to the tier's bounded deque,
O(1), nothing computed on the request path. ``summary(now)`` computes the figures on demand
(``GET /admin/routes``).

The window: per tier, the last ``MAX_ANSWERS`` (512) answers kept, of which those finished in
the last ``WINDOW_SECONDS`` (900 s) count: a quiet tier's old figures age out, a busy tier's
window is its latest answers.

What counts: a 200 answer served by one tier from one acquisition (no fallback, no stream
continued elsewhere: those mix two tiers' times) with at least one output token. Times are
taken from the moment the request was sent to its tier (``Exchange.acquire``), so a client's
slow upload and the gateway's own planning are not the tier's.

How normalised:

- **TPOT** (streams with more than one output token): ``(duration - ttft) / (output_tokens -
  1)``, the decode time per token after the first, independent of the answer's length.
- **TTFT** (streams): grows with the prompt (prefill), so it is kept per prompt-length bucket
  (``PROMPT_BUCKETS``: up to 256 tokens, up to 2048, longer).
- **Whole answers** give one duration only (no first byte of their own): they are counted
  separately as ``whole_ms_per_token``, ``duration / output_tokens`` with the prefill included,
  not mixed into TPOT (an estimated TTFT subtracted from them would put the streams' noise
  into their figure).
- **Load**: the number of requests this replica had in flight on the tier when the request
  was sent there, itself included, bucketed into ``LOAD_LEVELS`` (1, 2-4, 5+): TPOT is also
  given per load level, since a tier's per-token time depends on how busy it is.

Each figure is a median with a 95 % distribution-free interval of the median (order
statistics: ranks ``n/2 -+ 1.96 sqrt(n)/2``, the binomial's normal approximation), given from
``MIN_INTERVAL`` samples; below that the median alone. Per endpoint of a tier's pool the TPOT
is given too when the tier's answers came from more than one endpoint.

These figures are shown beside the calibration's (``/admin/routes``); with the policy's
``live_routes`` on, the per-token times also scale the calibration's figures the routes are
derived from (gateway/control/live_routes.py).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_ANSWERS = 512
WINDOW_SECONDS = 900.0
PROMPT_BUCKETS = ((256, "<=256"), (2048, "257-2048"), (None, ">2048"))
LOAD_LEVELS = ((1, "1"), (4, "2-4"), (None, "5+"))
MIN_INTERVAL = 6  # samples below which a median has no interval
Z95 = 1.959964


@dataclass(frozen=True, slots=True)
class Answered:
    """One finished answer as the exchange saw it (seconds from the request's arrival)."""

    tier: str
    status: int
    duration: float
    ttft: float | None  # None: a whole answer (no first byte seen)
    sent: float  # when it was sent to its tier (the tier's times start there)
    input_tokens: int | None
    output_tokens: int | None
    load: int  # this replica's requests in flight on the tier when it was sent, itself included
    acquisitions: int = 1  # tiers the request was sent to (more: fallback or continuation)
    fallbacks: int = 0
    endpoint: str | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """An answer that counts, normalised (see the module docstring)."""

    at: float
    endpoint: str | None
    load: int
    prompt_tokens: int | None
    ttft: float | None  # streams only
    tpot: float | None  # streams with more than one output token
    whole_per_token: float | None  # whole answers only


@dataclass(frozen=True)
class Stat:
    """A median (ms) with its interval, over ``n`` samples."""

    n: int
    median: float
    low: float | None = None
    high: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.n, "median_ms": round(self.median * 1000, 3)}
        if self.low is not None and self.high is not None:
            out["interval_ms"] = [round(self.low * 1000, 3), round(self.high * 1000, 3)]
        return out


def sample_of(answer: Answered, at: float) -> Sample | None:
    """The answer normalised, or ``None`` when it does not count (the module docstring)."""
    out = answer.output_tokens
    duration = answer.duration - answer.sent
    if (
        answer.status != 200
        or answer.acquisitions != 1
        or answer.fallbacks
        or out is None
        or out < 1
        or duration <= 0
    ):
        return None
    if answer.ttft is None:
        return Sample(at, answer.endpoint, answer.load, answer.input_tokens, None, None,
                      duration / out)  # fmt: skip
    ttft = max(0.0, answer.ttft - answer.sent)
    tpot = (duration - ttft) / (out - 1) if out > 1 else None
    return Sample(at, answer.endpoint, answer.load, answer.input_tokens, ttft, tpot, None)


def median_stat(values: Sequence[float]) -> Stat | None:
    """The median with its distribution-free 95 % interval (``None`` for no values)."""
    n = len(values)
    if n == 0:
        return None
    ordered = sorted(values)
    mid = n // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    if n < MIN_INTERVAL:
        return Stat(n, median)
    half = Z95 * math.sqrt(n) / 2
    low = max(1, math.floor(n / 2 - half))  # 1-based ranks
    high = min(n, math.ceil(n / 2 + 1 + half))
    return Stat(n, median, ordered[low - 1], ordered[high - 1])


def bucket(value: int | None, levels: Sequence[tuple[int | None, str]]) -> str:
    """The label of the first level whose bound holds ``value`` (unknown: the first)."""
    for bound, label in levels:
        if value is None or bound is None or value <= bound:
            return label
    return levels[-1][1]


def summarise(samples: Iterable[Sample]) -> dict[str, Any]:
    """One tier's figures from its samples in the window (the module docstring)."""
    kept = list(samples)
    streams = [s for s in kept if s.ttft is not None]
    out: dict[str, Any] = {"n": len(kept), "streams": len(streams)}
    out["whole"] = len(kept) - len(streams)
    tpot = median_stat([s.tpot for s in streams if s.tpot is not None])
    if tpot is not None:
        out["tpot_ms"] = tpot.as_dict()
    ttft: dict[str, Any] = {}
    for _, label in PROMPT_BUCKETS:
        stat = median_stat(
            [s.ttft for s in streams if s.ttft is not None
             and bucket(s.prompt_tokens, PROMPT_BUCKETS) == label]
        )  # fmt: skip
        if stat is not None:
            ttft[label] = stat.as_dict()
    if ttft:
        out["ttft_ms_by_prompt_tokens"] = ttft
    whole = median_stat([s.whole_per_token for s in kept if s.whole_per_token is not None])
    if whole is not None:
        out["whole_ms_per_token"] = whole.as_dict()
    by_load: dict[str, Any] = {}
    for _, label in LOAD_LEVELS:
        at_load = [s for s in streams if bucket(s.load, LOAD_LEVELS) == label]
        stat = median_stat([s.tpot for s in at_load if s.tpot is not None])
        if stat is not None:
            by_load[label] = {"tpot_ms": stat.as_dict()}
    if by_load:
        out["tpot_by_load"] = by_load
    endpoints = sorted({s.endpoint for s in kept if s.endpoint is not None})
    if len(endpoints) > 1:
        out["endpoints"] = {}
        for endpoint in endpoints:
            mine = [s for s in kept if s.endpoint == endpoint]
            entry: dict[str, Any] = {"n": len(mine)}
            stat = median_stat([s.tpot for s in mine if s.tpot is not None])
            if stat is not None:
                entry["tpot_ms"] = stat.as_dict()
            out["endpoints"][endpoint] = entry
    return out


@dataclass
class LiveFigures:
    """Per-tier windows of answers (the holder); ``observe`` is the exchange's hook."""

    max_answers: int = MAX_ANSWERS
    window_seconds: float = WINDOW_SECONDS
    clock: Callable[[], float] = time.monotonic
    _windows: dict[str, deque[Sample]] = field(default_factory=dict)

    def observe(self, answer: Answered) -> None:
        """Keep the answer if it counts: one append (the request path)."""
        sample = sample_of(answer, self.clock())
        if sample is None:
            return
        window = self._windows.get(answer.tier)
        if window is None:
            window = self._windows[answer.tier] = deque(maxlen=self.max_answers)
        window.append(sample)

    def summary(self) -> dict[str, Any]:
        """Per tier, the figures of the answers in the window (JSON-ready)."""
        since = self.clock() - self.window_seconds
        return {
            tier: summarise(s for s in list(window) if s.at >= since)
            for tier, window in sorted(self._windows.items())
        }

    def windows(self) -> dict[str, list[Sample]]:
        """Per tier, a copy of its kept samples (the live routes read them: live_routes.py)."""
        return {tier: list(window) for tier, window in self._windows.items()}

    def describe_window(self) -> dict[str, Any]:
        return {"answers": self.max_answers, "seconds": self.window_seconds}
