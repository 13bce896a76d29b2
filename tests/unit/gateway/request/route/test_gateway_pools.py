"""Tier pools through a real gateway and real stub tiers on 127.0.0.1: failover between the
endpoints of one tier, the endpoint header, session affinity, /admin/tiers and /metrics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.config import GatewayConfig, TierEndpoint, hash_key
from gateway.request.route.endpoint_choice import endpoint_id, hrw_score
from gateway.server import server_options
from tests.servers import ServerThread
from tests.unit.gateway.conftest import MODEL, StubTier

DATA = Path(__file__).parents[3] / "backends" / "data"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Capital of France?"}]}
ADMIN = "admin-key"


def busier(stub: StubTier) -> StubTier:
    """``stub`` scraped with one request running (KV 5 %): an idle endpoint goes before it."""
    text = (DATA / "vllm-0.32-cpu-running.txt").read_text()
    stub.metrics_text = text.replace('model_name="m"', f'model_name="{MODEL}"')
    return stub


def gateway_over(start_server: Callable[..., str], *pools: list[str], **overrides: Any) -> str:
    """A gateway whose tiers t0, t1, ... are the given pools (never re-scraped: the states the
    first scrape saw stay)."""
    tiers = [TierEndpoint(name=f"t{i}", endpoints=urls) for i, urls in enumerate(pools)]
    settings = {"metrics_interval": 3600.0, "admin_key_hashes": [hash_key(ADMIN)], **overrides}
    config = GatewayConfig(model_name=MODEL, tiers=tiers, **settings)
    return start_server(create_app(config), **server_options(config))


def test_a_refused_endpoint_fails_over_to_the_next_endpoint_of_its_tier(
    make_stub: Callable[[], StubTier], start_server: Callable[..., str], client: httpx.Client
) -> None:
    doomed = StubTier()
    server = ServerThread(doomed.app)
    server.start()
    doomed.url = server.url
    spare, next_tier = busier(make_stub()), make_stub()
    gateway = gateway_over(start_server, [doomed.url, spare.url], [next_tier.url])
    server.stop()  # ready at the scrape, refusing connections now
    answer = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-route-tier"] == "t0"
    assert answer.headers["x-route-endpoint"] == endpoint_id(spare.url)  # no address: minimal
    with client.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}
    ) as streamed:
        assert streamed.headers["x-route-endpoint"] == endpoint_id(spare.url)
        assert list(streamed.iter_lines())[-2:] == ["data: [DONE]", ""]
    assert len(spare.requests) == 2 and next_tier.requests == []
    fallbacks = {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(client.get(f"{gateway}/metrics").text)
        for sample in family.samples
        if sample.name == "gateway_upstream_fallbacks_total" and sample.labels["tier"] == "t0"
    }
    assert fallbacks == {"unreachable": 2.0}  # the refused endpoint was tried first, twice
    told = client.post(  # an admin key is told everything: the address
        f"{gateway}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {ADMIN}"}
    )
    assert told.headers["x-route-endpoint"] == spare.url


def test_an_endpoint_answering_503_fails_over_within_the_tier(
    make_stub: Callable[[], StubTier], start_server: Callable[..., str], client: httpx.Client
) -> None:
    busy, spare, next_tier = make_stub(), busier(make_stub()), make_stub()
    busy.mode = "unavailable"
    gateway = gateway_over(start_server, [busy.url, spare.url], [next_tier.url])
    answer = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert (answer.status_code, answer.headers["x-route-tier"]) == (200, "t0")
    assert (len(busy.requests), len(spare.requests), len(next_tier.requests)) == (1, 1, 0)


def test_a_pool_that_fails_entirely_moves_on_to_the_next_tier(
    make_stub: Callable[[], StubTier], start_server: Callable[..., str], client: httpx.Client
) -> None:
    first, second, next_tier = make_stub(), make_stub(), make_stub()
    first.mode = second.mode = "unavailable"
    gateway = gateway_over(start_server, [first.url, second.url], [next_tier.url])
    answer = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert (answer.status_code, answer.headers["x-route-tier"]) == (200, "t1")
    assert (len(first.requests), len(second.requests)) == (1, 1)
    assert answer.headers["x-route-endpoint"] == endpoint_id(next_tier.url)


def test_a_session_stays_on_its_endpoint(
    make_stub: Callable[[], StubTier], start_server: Callable[..., str], client: httpx.Client
) -> None:
    stubs = [make_stub() for _ in range(3)]
    gateway = gateway_over(start_server, [stub.url for stub in stubs])
    for session in ("conversation-1", "conversation-2"):
        own = max(stubs, key=lambda stub: hrw_score(session, stub.url))
        before = len(own.requests)
        for _ in range(3):
            answer = client.post(
                f"{gateway}/v1/chat/completions", json=CHAT, headers={"x-session-id": session}
            )
            assert answer.headers["x-route-endpoint"] == endpoint_id(own.url)
        answer = client.post(f"{gateway}/v1/chat/completions", json={**CHAT, "user": session})
        assert answer.headers["x-route-endpoint"] == endpoint_id(own.url)  # OpenAI's user field
        assert len(own.requests) == before + 4


def test_admin_tiers_and_metrics_show_each_endpoint(
    make_stub: Callable[[], StubTier],
    start_server: Callable[..., str],
    client: httpx.Client,
    refused_url: str,
) -> None:
    live = busier(make_stub())
    gateway = gateway_over(start_server, [live.url, refused_url])
    tiers = client.get(
        f"{gateway}/admin/tiers", headers={"authorization": f"Bearer {ADMIN}"}
    ).json()["tiers"]
    assert tiers["t0"]["state"] == "ready"
    shown = [(e["url"], e["id"], e["state"]) for e in tiers["t0"]["endpoints"]]
    assert shown == [
        (live.url, endpoint_id(live.url), "ready"),
        (refused_url, endpoint_id(refused_url), "down"),
    ]
    assert tiers["t0"]["endpoints"][0]["requests_running"] == 1.0
    found = {
        (sample.name, sample.labels["endpoint"]): sample.value
        for family in text_string_to_metric_families(client.get(f"{gateway}/metrics").text)
        for sample in family.samples
        if sample.name.startswith("gateway_endpoint_")
    }
    assert found[("gateway_endpoint_up", live.url)] == 1.0
    assert found[("gateway_endpoint_up", refused_url)] == 0.0
    assert found[("gateway_endpoint_kv_usage_ratio", live.url)] > 0


def test_a_dns_tier_is_resolved_at_start(
    make_stub: Callable[[], StubTier], start_server: Callable[..., str], client: httpx.Client
) -> None:
    stub = make_stub()
    port = stub.url.rsplit(":", 1)[1]
    config = GatewayConfig(
        model_name=MODEL,
        tiers=[TierEndpoint.model_validate({"name": "t0", "dns": f"localhost:{port}"})],
        admin_key_hashes=[hash_key(ADMIN)],
    )
    gateway = start_server(create_app(config), **server_options(config))
    tiers = client.get(
        f"{gateway}/admin/tiers", headers={"authorization": f"Bearer {ADMIN}"}
    ).json()["tiers"]
    urls = [endpoint["url"] for endpoint in tiers["t0"]["endpoints"]]
    assert stub.url in urls  # localhost's IPv4 address (and ::1, when it has one)
    assert tiers["t0"]["dns"] == f"http://localhost:{port}"
    answer = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert answer.status_code == 200 and len(stub.requests) == 1
