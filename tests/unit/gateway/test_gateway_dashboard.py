"""The shipped Grafana dashboard only queries series the gateway exports (it cannot drift)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.gateway.conftest import MODEL, StubTier

DASHBOARD = Path(__file__).resolve().parents[3] / "monitoring" / "grafana" / "model-optimizer.json"
DATA = Path(__file__).parents[1] / "backends" / "data"
METRIC = re.compile(r"\b(gateway_[a-z0-9_]+)\b")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def exported_names(text: str) -> set[str]:
    """Every series name ``text`` has or would have: its samples, and for a family without
    samples yet (a labelled counter nothing has counted), the names its type gives it."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def test_every_dashboard_query_names_an_exported_series(
    make_stub: Callable[[], StubTier],
    start_gateway: Callable[..., str],
    client: httpx.Client,
) -> None:
    stub = make_stub()
    running = (DATA / "vllm-0.32-cpu-running.txt").read_text()
    stub.metrics_text = running.replace('model_name="m"', f'model_name="{MODEL}"')
    gateway = start_gateway(stub.url)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert client.post(f"{gateway}/v1/chat/completions", json=chat).status_code == 200
    exported = exported_names(client.get(f"{gateway}/metrics").text)

    dashboard = json.loads(DASHBOARD.read_text())
    queried: set[str] = set()
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            names = set(METRIC.findall(target["expr"]))
            assert names, f"panel {panel['title']!r} queries no gateway series"
            queried |= names
    missing = sorted(queried - exported)
    assert not missing, f"the dashboard queries series the gateway does not export: {missing}"
    # The dashboard covers the monitoring signals, not just some of them.
    for required in (
        "gateway_requests_total",
        "gateway_time_to_first_token_seconds_bucket",
        "gateway_tier_kv_usage_ratio",
        "gateway_tier_kv_tokens_per_request",
        "gateway_tier_preemptions_total",
        "gateway_tier_peak_memory_bytes",
        "gateway_shadow_deviations_total",
        "gateway_shadow_agreement_bucket",
        "gateway_kv_resets_total",
        "gateway_route_changes_total",
        "gateway_route_first_tier",
    ):
        assert required in queried, required
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"


def test_a_name_the_gateway_does_not_export_is_caught() -> None:
    text = "# HELP gateway_x_total X.\n# TYPE gateway_x_total counter\n"
    names = exported_names(text)
    assert "gateway_x_total" in names and "gateway_y_total" not in names
