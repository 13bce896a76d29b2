"""Per-request results → one run's serving figures, named as ``vllm bench serve`` names them (pure).

Definitions follow vLLM 0.32's ``vllm/benchmarks/serve.py`` (``calculate_metrics``) so a run can
be set beside one of ``vllm bench serve --save-result``:

- TTFT: request sent → first streamed chunk carrying a choice.
- ITL: the gaps between consecutive such chunks (all requests pooled).
- TPOT: ``(e2el - ttft) / (output_tokens - 1)`` per request with more than one output token.
- E2EL: request sent → last chunk carrying a choice.
- throughputs divide by the run's wall-clock ``duration``.
- percentiles interpolate linearly between closest ranks (numpy's default method).

``percentile`` is the project's one percentile: the benchmark scripts under benchmarks/ use it
too, so a p99 means the same thing in every table.

One difference on purpose: vLLM reports 0 ms for a latency with no samples (``np.mean(x or 0)``);
here it is ``None`` (JSON null), so an all-failed run cannot read as infinitely fast.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass(frozen=True)
class RequestResult:
    """One request as the load generator saw it; times in seconds (``time.perf_counter``)."""

    start_time: float
    success: bool
    prompt_len: int = 0  # the server's usage.prompt_tokens (else the prompt's own count)
    output_tokens: int = 0  # the server's usage.completion_tokens (else chunks with text)
    ttft: float = 0.0
    itl: tuple[float, ...] = ()
    latency: float = 0.0  # e2el
    error: str = ""


@dataclass(frozen=True)
class ServingStats:
    """A run's figures; field names are those of ``vllm bench serve``'s result JSON."""

    duration: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    std_ttft_ms: float | None = None
    p50_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    std_tpot_ms: float | None = None
    p50_tpot_ms: float | None = None
    p90_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    std_itl_ms: float | None = None
    p50_itl_ms: float | None = None
    p90_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    mean_e2el_ms: float | None = None
    median_e2el_ms: float | None = None
    std_e2el_ms: float | None = None
    p50_e2el_ms: float | None = None
    p90_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None
    # Per request, in the order sent (vLLM's lists of the same names).
    input_lens: list[int] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    itls: list[list[float]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def percentile(values: Sequence[float], p: float, *, empty: float | None = None) -> float:
    """The ``p``-th percentile (0-100) with linear interpolation, as ``numpy.percentile``.

    No values: ``empty`` when given (the benchmark scripts pass NaN), else ``ValueError``.
    """
    if not values:
        if empty is not None:
            return empty
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, not {p}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary_ms(values: Sequence[float]) -> dict[str, float | None]:
    """mean, median, std (population, as ``numpy.std``) and p50/p90/p99, seconds → ms."""
    if not values:
        return {"mean": None, "median": None, "std": None, **{f"p{p}": None for p in PERCENTILES}}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    out: dict[str, float | None] = {
        "mean": mean * 1000,
        "median": percentile(values, 50) * 1000,
        "std": std * 1000,
    }
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(values, p) * 1000
    return out


def _peak_per_second(done: Sequence[RequestResult]) -> tuple[float, int]:
    """vLLM's max_output_tokens_per_s and max_concurrent_requests (1-second buckets)."""
    if not done:
        return 0.0, 0
    first = min(r.start_time for r in done)
    last = max(r.start_time + r.latency for r in done)
    buckets = math.ceil(last - first) + 1
    tokens = [0] * buckets
    running = [0] * buckets
    for r in done:
        at = r.start_time + r.ttft
        times = [at]
        for gap in r.itl:
            at += gap
            times.append(at)
        for t in times:
            second = int(t - first)
            if 0 <= second < buckets:
                tokens[second] += 1
        for second in range(int(r.start_time - first), int(r.start_time + r.latency - first) + 1):
            running[second] += 1
    return float(max(tokens)), max(running)


def compute_stats(results: Sequence[RequestResult], duration: float) -> ServingStats:
    """The run's figures from its requests and its wall-clock ``duration`` (seconds, > 0)."""
    if duration <= 0:
        raise ValueError(f"duration must be positive, not {duration}")
    done = [r for r in results if r.success]
    ttfts = [r.ttft for r in done]
    e2els = [r.latency for r in done]
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    itls = [gap for r in done for gap in r.itl]
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_tokens for r in done)
    peak_tokens, peak_running = _peak_per_second(done)
    latency_fields: dict[str, float | None] = {}
    for name, values in zip(METRICS, (ttfts, tpots, itls, e2els), strict=True):
        for stat, value in summary_ms(values).items():
            latency_fields[f"{stat}_{name}_ms"] = value
    return ServingStats(
        duration=duration,
        completed=len(done),
        failed=len(results) - len(done),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=len(done) / duration,
        output_throughput=total_out / duration,
        total_token_throughput=(total_in + total_out) / duration,
        max_output_tokens_per_s=peak_tokens,
        max_concurrent_requests=peak_running,
        input_lens=[r.prompt_len for r in results],
        output_lens=[r.output_tokens if r.success else 0 for r in results],
        ttfts=[r.ttft for r in results],
        itls=[list(r.itl) for r in results],
        latencies=[r.latency for r in results],
        errors=[r.error for r in results],
        **latency_fields,
    )
