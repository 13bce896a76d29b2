"""Per-tier monitoring signals derived from a tier's scrape and its memory samples (pure).

Definitions (what ``/metrics`` exports as ``gateway_tier_*``, see gateway/metrics.py):

- KV usage: vLLM's ``vllm:kv_cache_usage_perc``, 0..1, the share of the usable KV blocks held
  by requests (cached prefix blocks no request holds count as free).
- KV capacity, tokens: usable blocks x block size (``vllm:cache_config_info``'s
  ``num_gpu_blocks`` less the null block, and ``block_size``).
- KV tokens per request: KV usage x KV capacity / ``vllm:num_requests_running``, i.e. the
  token slots of the blocks in use shared out over the running requests. Whole blocks are
  counted (a request's last block is partly empty) and a prefix block shared by several
  requests counts once, so it is the pool's cost per running request, not a prompt length.
  Undefined (not exported) while no request runs or before the pool size is known.
- Preemptions: ``vllm:num_preemptions_total`` mirrored (a counter: it restarts with the tier).
- Memory: resident set size (RSS) of the tier's whole process tree (vLLM's API server and its
  engine-core process; pages shared between them count in each), sampled every scrape by
  gateway/control/tier_memory.py; peak = the largest sample since the tier's root process started.
  vLLM's own ``process_resident_memory_bytes`` covers its API server process only, which holds
  neither the weights nor the KV pool, so it is not used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from backends.metrics import KV_CACHE_USAGE, PREEMPTIONS, RUNNING, TierMetrics


@dataclass(frozen=True)
class MemorySample:
    """One look at a tier's process tree: its root process and the tree's total RSS."""

    pid: int
    rss_bytes: int


@dataclass(frozen=True)
class TierSignals:
    """A tier's monitoring values; ``None``: not known (not exported)."""

    kv_usage: float | None = None
    kv_capacity_tokens: int | None = None
    kv_tokens_per_request: float | None = None
    preemptions: float | None = None
    memory_bytes: int | None = None
    peak_memory_bytes: int | None = None


def derive_signals(
    metrics: TierMetrics | None, memory: MemorySample | None, peak: int | None
) -> TierSignals:
    """The signals of one tier from its last scrape (``None``: none parsed) and memory."""
    memory_bytes = memory.rss_bytes if memory is not None else None
    if metrics is None:
        return TierSignals(memory_bytes=memory_bytes, peak_memory_bytes=peak)
    missing = set(metrics.missing)
    usage = None if KV_CACHE_USAGE[0] in missing else metrics.kv_cache_usage
    capacity = (
        metrics.kv_blocks * metrics.block_size
        if metrics.kv_blocks is not None and metrics.block_size is not None
        else None
    )
    return TierSignals(
        kv_usage=usage,
        kv_capacity_tokens=capacity,
        kv_tokens_per_request=kv_tokens_per_request(
            usage, capacity, None if RUNNING[0] in missing else metrics.requests_running
        ),
        preemptions=None if PREEMPTIONS[0] in missing else metrics.preemptions,
        memory_bytes=memory_bytes,
        peak_memory_bytes=peak,
    )


def kv_tokens_per_request(
    usage: float | None, capacity_tokens: int | None, running: float | None
) -> float | None:
    """KV token slots in use per running request (see the module docstring); ``None`` when
    any input is unknown or no request runs."""
    if usage is None or capacity_tokens is None or running is None or running <= 0:
        return None
    return usage * capacity_tokens / running


@dataclass
class PeakMemory:
    """The largest memory sample per tier since its root process (re)started."""

    _peaks: dict[str, MemorySample] = field(default_factory=dict)

    def observe(self, tier: str, sample: MemorySample) -> int:
        """Record ``sample``; returns the tier's peak (a new root process starts over)."""
        before = self._peaks.get(tier)
        if before is None or before.pid != sample.pid or sample.rss_bytes > before.rss_bytes:
            self._peaks[tier] = MemorySample(sample.pid, sample.rss_bytes)
            return sample.rss_bytes
        return before.rss_bytes

    def peak(self, tier: str) -> int | None:
        found = self._peaks.get(tier)
        return found.rss_bytes if found is not None else None


def still_running(in_flight: Mapping[str, int], tier: str, metrics: TierMetrics | None) -> float:
    """Requests still on a tier a reset drains: the larger of the replicas' shared in-flight
    count and the tier's own running count at its last scrape (vLLM's num_requests_running,
    llama.cpp's requests_processing). Either alone can miss one: while Redis is away (the
    process stalled past its op timeout, say) the shared count is one replica's alone, and a
    scrape is up to one interval old. Seen: a drain that read 0 during such a stall reset a
    tier still answering another replica's request, which vLLM then refused."""
    running = metrics.requests_running if metrics is not None else 0.0
    return max(float(in_flight.get(tier, 0)), running)
