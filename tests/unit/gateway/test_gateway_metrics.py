"""GatewayMetrics: private registry, labelled series, histogram counts and both text formats."""

from __future__ import annotations

import math

import prometheus_client
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    """The value of the one sample called ``name`` with exactly ``labels``, parsed from text."""
    body, _ = metrics.render(None)
    for family in text_string_to_metric_families(body.decode()):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return float(found.value)
    return None


def test_two_instances_share_nothing() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.reject("rate_limited")
    first.observe_request("chat", "int8", 200, 0.5)
    assert sample(first, "gateway_rejections_total", reason="rate_limited") == 1
    assert sample(second, "gateway_rejections_total", reason="rate_limited") is None
    assert sample(second, "gateway_requests_total", **{"class": "chat"}, tier="int8") is None
    # Nothing leaks into prometheus_client's process-wide default registry either.
    assert b"gateway_" not in prometheus_client.generate_latest(prometheus_client.REGISTRY)


def test_observe_request_increments_the_labelled_series() -> None:
    metrics = GatewayMetrics()
    metrics.observe_request("chat", "int8", 200, 0.4, ttft=0.1, input_tokens=12, output_tokens=30)
    metrics.observe_request("chat", "int8", 200, 0.6, input_tokens=8, output_tokens=0)
    metrics.observe_request("code", None, 429, 0.001)

    ok = {"class": "chat", "tier": "int8"}
    assert sample(metrics, "gateway_requests_total", **ok, status="200") == 2
    assert sample(metrics, "gateway_requests_total", **{"class": "code"}, tier="none", status="429")
    assert sample(metrics, "gateway_requests_total", **ok, status="429") is None
    assert sample(metrics, "gateway_tokens_total", **ok, direction="input") == 20
    assert sample(metrics, "gateway_tokens_total", **ok, direction="output") == 30
    # No token counts given: no token series for that class.
    no_tier = {"class": "code", "tier": "none"}
    assert sample(metrics, "gateway_tokens_total", **no_tier, direction="input") is None


def test_histograms_count_into_the_right_buckets() -> None:
    metrics = GatewayMetrics()
    for duration in (0.003, 0.2, 150.0):
        metrics.observe_request("chat", "fp16", 200, duration, ttft=duration / 2)
    metrics.observe_request("chat", "fp16", 503, 1.0)  # no ttft: the ttft histogram skips it

    labels = {"class": "chat", "tier": "fp16"}
    name = "gateway_request_duration_seconds"
    assert sample(metrics, f"{name}_bucket", **labels, le="0.005") == 1
    assert sample(metrics, f"{name}_bucket", **labels, le="0.25") == 2
    assert sample(metrics, f"{name}_bucket", **labels, le="120.0") == 3
    assert sample(metrics, f"{name}_bucket", **labels, le="+Inf") == 4
    assert sample(metrics, f"{name}_count", **labels) == 4
    total = sample(metrics, f"{name}_sum", **labels)
    assert total is not None and math.isclose(total, 151.203)

    ttft = "gateway_time_to_first_token_seconds"
    assert sample(metrics, f"{ttft}_count", **labels) == 3
    assert sample(metrics, f"{ttft}_bucket", **labels, le="0.005") == 1
    assert sample(metrics, f"{ttft}_bucket", **labels, le="60.0") == 2


def test_rejections_fallbacks_tiers_and_reloads() -> None:
    metrics = GatewayMetrics()
    metrics.reject("context_length_exceeded")
    metrics.reject("context_length_exceeded")
    metrics.fallback("int4", "connect_error")
    metrics.set_tier("int4", in_flight=3, up=True)
    metrics.set_tier("int4", in_flight=1, up=False)
    metrics.policy_reload("applied")
    metrics.policy_reload("unchanged")
    metrics.policy_reload("unchanged")

    assert sample(metrics, "gateway_rejections_total", reason="context_length_exceeded") == 2
    fallback = {"tier": "int4", "reason": "connect_error"}
    assert sample(metrics, "gateway_upstream_fallbacks_total", **fallback) == 1
    assert sample(metrics, "gateway_tier_in_flight", tier="int4") == 1
    assert sample(metrics, "gateway_tier_up", tier="int4") == 0
    assert sample(metrics, "gateway_policy_reloads_total", outcome="applied") == 1
    assert sample(metrics, "gateway_policy_reloads_total", outcome="unchanged") == 2
    with pytest.raises(ValueError, match="bogus"):
        metrics.policy_reload("bogus")


def test_render_defaults_to_the_prometheus_text_format() -> None:
    metrics = GatewayMetrics()
    metrics.reject("unauthorized")
    for accept in (None, "", "text/plain", "*/*"):
        body, content_type = metrics.render(accept)
        assert content_type.startswith("text/plain"), accept
        assert not body.rstrip().endswith(b"# EOF")
    body, _ = metrics.render(None)
    assert b'gateway_rejections_total{reason="unauthorized"} 1.0' in body


def test_render_speaks_openmetrics_when_asked() -> None:
    metrics = GatewayMetrics()
    metrics.observe_request("chat", "int8", 200, 0.5, input_tokens=4)
    accept = "application/openmetrics-text; version=1.0.0, text/plain;q=0.5"
    body, content_type = metrics.render(accept)
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")
    families = {family.name: family for family in parse_openmetrics(body.decode())}
    requests = families["gateway_requests"]
    assert requests.type == "counter"
    values = {
        (found.labels["class"], found.labels["tier"], found.labels["status"]): found.value
        for found in requests.samples
        if found.name == "gateway_requests_total"
    }
    assert values == {("chat", "int8", "200"): 1}
