"""/healthz, /readyz and /v1/models through a real gateway."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

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
    # t0 refuses at once, but t1 may be found ready first: then t0 is not waited for
    tiers = response.json()["tiers"]
    assert response.json()["status"] == "ready" and tiers["t1"] == "ok"
    assert tiers["t0"] in ("unreachable", "not waited for")


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


@pytest.fixture
def hung_url() -> Iterator[str]:
    """A 127.0.0.1 URL that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_readyz_does_not_wait_on_a_hung_tier_when_another_is_ready(
    hung_url: str, stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    """The hung tier first in order: the healthy one answers the probe at once (it used to
    wait connect_timeout on the hung one, 5 s as shipped, past the Deployment's 3 s; 2 s here,
    as the gateway's first scrape waits that long twice on the hung tier before it serves)."""
    gateway = start_gateway(hung_url, stub.url, connect_timeout=2.0)
    started = time.monotonic()
    response = client.get(f"{gateway}/readyz")
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert response.json()["tiers"] == {"t0": "not waited for", "t1": "ok"}
    assert elapsed < 1.0


def test_readyz_is_503_within_readiness_timeout_when_every_tier_hangs(
    hung_url: str, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(hung_url, hung_url, readiness_timeout=0.5, connect_timeout=2.0)
    started = time.monotonic()
    response = client.get(f"{gateway}/readyz")
    elapsed = time.monotonic() - started
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "no tier is ready (t0 timed out, t1 timed out)"
    assert 0.5 <= elapsed < 1.5
