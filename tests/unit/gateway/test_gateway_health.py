"""/healthz, /readyz and /v1/models through a real gateway."""

from __future__ import annotations

from typing import Any

import httpx

MODEL = "stub-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_healthz_is_ok_without_any_tier(
    refused_url: str, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(refused_url)
    response = client.get(f"{gateway}/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_is_ok_when_one_tier_is_healthy(
    refused_url: str, stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(refused_url, stub.url)
    response = client.get(f"{gateway}/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "tiers": {"t0": "unreachable", "t1": "ok"}}


def test_readyz_is_503_when_no_tier_is_healthy(
    refused_url: str, stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    stub.health_status = 503  # e.g. vLLM still loading
    gateway = start_gateway(stub.url, refused_url)
    response = client.get(f"{gateway}/readyz")
    assert response.status_code == 503
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "not_ready"
    assert "t0 answered 503" in error["message"]
    assert "t1 unreachable" in error["message"]


def test_models_relays_the_first_reachable_tier(
    refused_url: str, stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(refused_url, stub.url)
    response = client.get(f"{gateway}/v1/models")
    assert response.status_code == 200
    assert response.headers["x-route-tier"] == "t1"
    body = response.json()
    assert body["object"] == "list"
    assert [entry["id"] for entry in body["data"]] == [MODEL]
    assert body["data"][0]["owned_by"] == "vllm"


def test_models_reports_a_tier_serving_another_model(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    stub.model = "something-else"
    gateway = start_gateway(stub.url)
    response = client.get(f"{gateway}/v1/models")
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "model_mismatch"
    assert error["message"] == f"the model server does not serve model '{MODEL}'"


def test_models_without_tiers_is_503(
    refused_url: str, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(refused_url)
    response = client.get(f"{gateway}/v1/models")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_tier_available"


def test_readyz_brings_the_router_up_to_date_with_a_tier_that_came_up(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    """A tier down at the gateway's first scrape and healthy since: /readyz scrapes it at once,
    so "ready" means a request is routed now, not 503 until the next scrape (a minute away)."""
    stub.health_status = 503  # still loading when the gateway starts
    gateway = start_gateway(stub.url, metrics_interval=60)
    assert client.get(f"{gateway}/readyz").status_code == 503
    refused = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert refused.status_code == 503  # the router holds it down
    stub.health_status = 200
    ready = client.get(f"{gateway}/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["tiers"] == {"t0": "ok"}
    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT).status_code == 200
