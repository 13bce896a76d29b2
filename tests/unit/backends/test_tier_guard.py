"""backends/tier_guard.py: the key on the routes vLLM 0.32's own --api-key leaves open."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from backends.tier_guard import TierGuard

KEY = "per-run-tier-key"
# What a vLLM 0.32 server with VLLM_SERVER_DEV_MODE=1 serves outside /v1 (read from its
# routers: serve/dev/*, rl/online, serve/profile, scale_out, elastic_ep).
CONTROL = (
    "/reset_prefix_cache",
    "/reset_mm_cache",
    "/collective_rpc",
    "/server_info",
    "/sleep",
    "/wake_up",
    "/is_sleeping",
    "/pause",
    "/resume",
    "/abort_requests",
    "/update_weights",
    "/init_weight_transfer_engine",
    "/start_profile",
    "/scale_elastic_ep",
    "/inference/v1/generate",
    "/v2/anything",
)


async def _echo(request: Request) -> PlainTextResponse:
    return PlainTextResponse(f"served {request.url.path}")


def _client(key: str | None) -> TestClient:
    app = Starlette(routes=[Route("/{path:path}", _echo, methods=["GET", "POST"])])
    app.add_middleware(TierGuard, key=key)
    return TestClient(app)


@pytest.mark.parametrize("path", CONTROL)
def test_control_routes_need_the_key(path: str) -> None:
    client = _client(KEY)
    assert client.post(path).status_code == 401
    wrong = client.post(path, headers={"Authorization": "Bearer not-the-key"})
    assert wrong.status_code == 401
    basic = client.post(path, headers={"Authorization": f"Basic {KEY}"})
    assert basic.status_code == 401
    ok = client.post(path, headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.text == f"served {path}"


@pytest.mark.parametrize(
    "path", ["/health", "/metrics", "/version", "/tokenize", "/v1/chat/completions", "/v1/models"]
)
def test_health_metrics_tokenize_and_the_openai_api_stay_open(path: str) -> None:
    assert _client(KEY).get(path).status_code == 200


def test_a_path_the_server_lacks_is_still_a_404() -> None:
    """``bench`` tells a tier from a gateway by the tier's 404 on /readyz."""
    app = Starlette(routes=[Route("/collective_rpc", _echo, methods=["POST"])])
    app.add_middleware(TierGuard, key=KEY)
    client = TestClient(app)
    assert client.get("/readyz").status_code == 404
    assert client.get("/collective_rpc").status_code == 401  # a route, whatever the method
    assert client.post("/collective_rpc").status_code == 401


def test_no_key_configured_closes_the_control_routes_to_everyone() -> None:
    client = _client(None)
    for header in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer anything"}):
        assert client.post("/collective_rpc", headers=header).status_code == 401
    assert client.get("/health").status_code == 200


def test_the_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MO_TIER_API_KEY", KEY)
    app = Starlette(routes=[Route("/{path:path}", _echo, methods=["POST"])])
    app.add_middleware(TierGuard)  # as vLLM adds it: no arguments
    client = TestClient(app)
    assert client.post("/sleep").status_code == 401
    assert client.post("/sleep", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
