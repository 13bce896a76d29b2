"""GET /admin/routes through a real gateway over stub tiers: the routes, the pin check, the
calibration beside the live figures of the answers relayed, and a route change made visible
(history, metrics)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.config import GatewayConfig, MeasuredTier, TierEndpoint, hash_key
from gateway.server import server_options
from tests.unit.gateway.conftest import MODEL, StubTier

ADMIN = {"authorization": "Bearer admin-key"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Capital of France?"}]}
LOAD = [1.00, 1.12, 0.95, 1.30, 1.02, 0.98, 1.45, 1.05]


def _measured(quality: float, tpot: float) -> MeasuredTier:
    return MeasuredTier(
        quality={"chat": quality, "code": quality, "math": quality},
        ttft_s=0.2, tpot_s=tpot, throughput_tok_s=1 / tpot,
        ttfts_s=[0.2 * x for x in LOAD], tpots_s=[tpot * x for x in LOAD],
    )  # fmt: skip


def _samples(text: str, name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value  # type: ignore[misc]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_admin_routes_shows_routes_figures_and_changes(
    make_stub: Callable[[], StubTier],
    start_server: Callable[..., str],
    client: httpx.Client,
    two_tier_policy: Callable[..., str],
) -> None:
    stubs = [make_stub(), make_stub()]
    policy = two_tier_policy()
    config = GatewayConfig(
        model_name=MODEL,
        tiers=[TierEndpoint(name=f"t{i}", base_url=s.url) for i, s in enumerate(stubs)],
        policy_path=policy,
        watch_policy=False,
        metrics_interval=3600.0,
        admin_key_hashes=[hash_key("admin-key")],
        measured={"t0": _measured(1.0, 0.0366), "t1": _measured(0.9, 0.018)},
        reference_tier="t0",
    )
    gateway = start_server(create_app(config), **server_options(config))
    assert client.get(f"{gateway}/admin/routes").status_code in (401, 403)
    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT).status_code == 200
    streamed = client.post(f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True})
    assert streamed.status_code == 200

    doc = client.get(f"{gateway}/admin/routes", headers=ADMIN).json()
    tolerant = doc["classes"]["tolerant"]
    assert tolerant["tiers"] == ["t0", "t1"] and tolerant["how"] == "pinned"
    assert tolerant["pin"].startswith("pinned; measurements prefer t1")
    assert tolerant["last_change"]["from"] is None  # loaded, never changed
    t0 = doc["tiers"]["t0"]
    assert t0["calibration"]["tpot_ms"] == 36.6 and t0["calibration"]["samples"] == 8
    assert (t0["live"]["n"], t0["live"]["streams"], t0["live"]["whole"]) == (2, 1, 1)
    assert t0["live"]["tpot_ms"]["n"] == 1 and "<=256" in t0["live"]["ttft_ms_by_prompt_tokens"]
    assert doc["tiers"]["t1"]["live"] is None

    metrics = client.get(f"{gateway}/metrics").text
    first = _samples(metrics, "gateway_route_first_tier")
    assert first[(("class", "tolerant"), ("tier", "t0"))] == 1.0
    assert not _samples(metrics, "gateway_route_changes_total")

    text = Path(policy).read_text().replace("tolerant: [t0, t1]", "tolerant: [t1, t0]")
    Path(policy).write_text(text)
    reload = client.post(f"{gateway}/admin/policy/reload", headers=ADMIN)
    assert reload.json()["outcome"] == "applied"
    doc = client.get(f"{gateway}/admin/routes", headers=ADMIN).json()
    last = doc["classes"]["tolerant"]["last_change"]
    assert (last["from"], last["to"]) == (["t0", "t1"], ["t1", "t0"])
    assert doc["classes"]["tolerant"]["pin"].startswith("pinned; measurements agree")
    assert doc["classes"]["code"]["last_change"]["from"] is None
    metrics = client.get(f"{gateway}/metrics").text
    assert _samples(metrics, "gateway_route_changes_total") == {(("class", "tolerant"),): 1.0}
    first = _samples(metrics, "gateway_route_first_tier")
    assert first[(("class", "tolerant"), ("tier", "t1"))] == 1.0
    assert (("class", "tolerant"), ("tier", "t0")) not in first


def test_admin_routes_without_a_policy_file_shows_the_configured_order(
    make_stub: Callable[[], StubTier],
    start_server: Callable[..., str],
    client: httpx.Client,
) -> None:
    stub = make_stub()
    config = GatewayConfig(
        model_name=MODEL,
        tiers=[TierEndpoint(name="t0", base_url=stub.url)],
        metrics_interval=3600.0,
        admin_key_hashes=[hash_key("admin-key")],
    )
    gateway = start_server(create_app(config), **server_options(config))
    doc = client.get(f"{gateway}/admin/routes", headers=ADMIN).json()
    assert {c["how"] for c in doc["classes"].values()} == {"pinned"}
    assert doc["classes"]["tolerant"] == {
        "tiers": ["t0"], "overflow": [], "reasons": {}, "how": "pinned", "pin": None,
        "last_change": None,
    }  # fmt: skip
    assert doc["history"] == [] and doc["tiers"] == {}
