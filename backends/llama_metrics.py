"""Parse a llama-server's Prometheus ``/metrics`` (``--metrics``) into the same snapshot a vLLM
tier gives (backends/metrics.py's ``TierMetrics``; pure).

llama.cpp 0c1e570 exports (tools/server/server-task.cpp), unlabelled:

- ``llamacpp:requests_processing`` (gauge): requests in a slot → ``requests_running``;
- ``llamacpp:requests_deferred`` (gauge): requests waiting for a free slot →
  ``requests_waiting`` (the saturation signal: every slot busy);
- ``llamacpp:prompt_tokens_total`` (prompt tokens evaluated, cached ones excluded) and
  ``llamacpp:prompt_tokens_cached_total`` (reused from a slot's cache) → prefix-cache queries
  (their sum) and hits (the cached ones), as vLLM counts them;
- ``llamacpp:tokens_predicted_total`` → ``generation_tokens``.

It has no KV-usage gauge (each slot owns a fixed ``max_model_len`` context: there is no shared
pool to fill), no preemptions (a slot is never taken back), no finished-request counter and no
TTFT histogram: those fields read 0 and are named in ``missing``, as for a vLLM scrape without
them, so the gateway's signals say "unknown", not "zero".
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from backends.metrics import (
    CACHE_CONFIG,
    E2E_SUM,
    FINISHED,
    KV_CACHE_USAGE,
    PREEMPTIONS,
    SLEEP_STATE,
    TTFT_SUM,
    MetricsParseError,
    TierMetrics,
)

PROCESSING = "llamacpp:requests_processing"
DEFERRED = "llamacpp:requests_deferred"
PROMPT = "llamacpp:prompt_tokens_total"
PROMPT_CACHED = "llamacpp:prompt_tokens_cached_total"
PREDICTED = "llamacpp:tokens_predicted_total"
# What a llama-server never has (named as the vLLM families the gateway's signals look for).
ABSENT = (
    KV_CACHE_USAGE[0],
    PREEMPTIONS[0],
    FINISHED[0],
    TTFT_SUM[0],
    E2E_SUM[0],
    SLEEP_STATE,
    CACHE_CONFIG,
)


def parse_llama_metrics(text: str) -> TierMetrics:
    """The tier's snapshot from a llama-server's ``/metrics`` text."""
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise MetricsParseError(f"malformed llama-server /metrics text: {reason}") from exc
    missing = [name for name in (PROCESSING, DEFERRED, PROMPT, PREDICTED) if name not in values]
    prompt, cached = values.get(PROMPT, 0.0), values.get(PROMPT_CACHED, 0.0)
    return TierMetrics(
        requests_running=values.get(PROCESSING, 0.0),
        requests_waiting=values.get(DEFERRED, 0.0),
        prefix_cache_queries=prompt + cached,
        prefix_cache_hits=cached,
        prompt_tokens=prompt + cached,
        generation_tokens=values.get(PREDICTED, 0.0),
        missing=(*missing, *ABSENT),
    )
