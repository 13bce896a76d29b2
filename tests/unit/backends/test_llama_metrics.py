"""backends/llama_metrics.py against a real llama-server scrape (tests/unit/backends/data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.llama_metrics import parse_llama_metrics
from backends.metrics import KV_CACHE_USAGE, MetricsParseError

SCRAPE = Path(__file__).parent / "data" / "llama-cpp-0c1e570-metrics.txt"


def test_a_real_scrape_reads_as_a_tier_snapshot() -> None:
    metrics = parse_llama_metrics(SCRAPE.read_text())
    assert (metrics.requests_running, metrics.requests_waiting) == (0.0, 0.0)
    # 3 prompt tokens evaluated and 1 found cached: 4 looked up, as vLLM counts queries
    assert (metrics.prefix_cache_queries, metrics.prefix_cache_hits) == (4.0, 1.0)
    assert metrics.generation_tokens == 16.0
    # what llama.cpp does not export is named missing (the gateway then says "unknown")
    assert KV_CACHE_USAGE[0] in metrics.missing
    assert "llamacpp:requests_processing" not in metrics.missing


def test_busy_slots_and_a_queue_are_running_and_waiting() -> None:
    text = SCRAPE.read_text().replace(
        "llamacpp:requests_processing 0", "llamacpp:requests_processing 4"
    )
    text = text.replace("llamacpp:requests_deferred 0", "llamacpp:requests_deferred 2")
    metrics = parse_llama_metrics(text)
    assert (metrics.requests_running, metrics.requests_waiting) == (4.0, 2.0)


def test_a_scrape_without_the_families_says_so_and_garbage_is_an_error() -> None:
    assert "llamacpp:requests_deferred" in parse_llama_metrics("").missing
    with pytest.raises(MetricsParseError, match="llama-server /metrics"):
        parse_llama_metrics("llamacpp:requests_processing not-a-number\n")
