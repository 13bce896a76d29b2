"""OpenAI's error shape as JSON, as an SSE event, and from the exception handlers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.config import hash_key
from gateway.errors import APIError, error_body, error_response, exception_handlers, sse_error_event

KEYS = {"message", "type", "param", "code"}


def test_error_body_shape() -> None:
    assert error_body("bad", param="model", code="x") == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "model", "code": "x"}
    }


def test_error_response_carries_status_and_body() -> None:
    response = error_response(503, "down", "server_error", headers={"retry-after": "1"})
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert json.loads(bytes(response.body))["error"]["type"] == "server_error"


def test_sse_error_event_is_one_event_then_done() -> None:
    raw = sse_error_event(APIError(502, "tier 'a' failed", "server_error", code="upstream_error"))
    events = raw.decode().split("\n\n")
    assert events[-1] == ""
    assert events[1] == "data: [DONE]"
    assert len(events) == 3
    payload = json.loads(events[0].removeprefix("data: "))
    assert set(payload["error"]) == KEYS
    assert payload["error"]["code"] == "upstream_error"


def _app() -> Starlette:
    async def api_error(request: Request) -> Response:
        raise APIError(409, "conflict here", code="conflict", headers={"x-extra": "1"})

    async def http_error(request: Request) -> Response:
        raise HTTPException(418, "short and stout")

    async def crash(request: Request) -> Response:
        raise RuntimeError("secret internals")

    routes = [
        Route("/api", api_error),
        Route("/http", http_error),
        Route("/crash", crash),
        Route("/post-only", api_error, methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers=exception_handlers())


def test_handlers_give_every_error_openai_shape() -> None:
    with TestClient(_app(), raise_server_exceptions=False) as client:
        api = client.get("/api")
        assert api.status_code == 409
        assert api.headers["x-extra"] == "1"
        assert api.json()["error"] == {
            "message": "conflict here",
            "type": "invalid_request_error",
            "param": None,
            "code": "conflict",
        }

        teapot = client.get("/http")
        assert teapot.status_code == 418
        assert teapot.json()["error"]["message"] == "short and stout"

        missing = client.get("/nowhere")
        assert missing.status_code == 404
        assert missing.json()["error"]["message"] == "Invalid URL (GET /nowhere)"

        wrong_method = client.get("/post-only")
        assert wrong_method.status_code == 405
        assert wrong_method.headers["allow"] == "POST"
        assert set(wrong_method.json()["error"]) == KEYS

        crash = client.get("/crash")
        assert crash.status_code == 500
        assert crash.json()["error"]["type"] == "server_error"
        assert "secret" not in crash.text


# --- how much a client is told (the policy's errors.detail) ---------------------------------

ADMIN = "admin-key"
CHAT = {"messages": [{"role": "user", "content": "Capital of France?"}]}
INSIDES = ("t0", "t1", "127.0.0.1", "unreachable", "ConnectError")


def _full_policy(tmp_path: Path, detail: str) -> str:
    route = "[t0, t1]"
    path = tmp_path / "routing.yaml"
    path.write_text(
        f"tiers: [t0, t1]\nroutes: {{tolerant: {route}, code: {route}, math: {route}, "
        f"long: {route}}}\nerrors: {{detail: {detail}}}\n"
    )
    return str(path)


def test_clients_are_not_told_the_tiers_insides_by_default(
    refused_url: str, stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(refused_url, refused_url, admin_key_hashes=[hash_key(ADMIN)])
    down = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert down.status_code == 503
    error = down.json()["error"]
    assert error["code"] == "no_tier_available" and error["type"] == "server_error"
    assert not any(word in error["message"] for word in INSIDES), error["message"]
    assert "x-route-reason" not in down.headers
    admin = {"Authorization": f"Bearer {ADMIN}"}  # an operator sees everything
    told = client.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=admin)
    assert told.status_code == 503
    assert "t0 (down)" in told.json()["error"]["message"]
    assert "x-route-reason" in told.headers

    served = start_gateway(stub.url, admin_key_hashes=[hash_key(ADMIN)])
    answer = client.post(f"{served}/v1/chat/completions", json=CHAT)
    assert answer.status_code == 200
    assert (answer.headers["x-route-class"], answer.headers["x-route-tier"]) == ("tolerant", "t0")
    assert "x-route-reason" not in answer.headers
    answer = client.post(f"{served}/v1/chat/completions", json=CHAT, headers=admin)
    assert answer.headers["x-route-reason"].startswith("tolerant")


def test_a_stream_cut_short_tells_the_client_little(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    stub.mode = "die"
    gateway = start_gateway(stub.url)
    with client.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}
    ) as response:
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "upstream_error"
    assert not any(word in error["message"] for word in INSIDES), error["message"]


def test_the_policy_may_tell_every_client_everything(
    refused_url: str, stub: Any, start_gateway: Any, client: httpx.Client, tmp_path: Path
) -> None:
    policy = _full_policy(tmp_path, "full")
    gateway = start_gateway(refused_url, stub.url, policy_path=policy, watch_policy=False)
    answer = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert answer.headers["x-route-tier"] == "t1"
    assert answer.headers["x-route-reason"].startswith("tolerant")
    stub.mode = "unavailable"
    down = client.post(f"{gateway}/v1/chat/completions", json=CHAT)
    assert "t1 answered 503" in down.json()["error"]["message"]


LEAK = "RuntimeError: CUDA error at 10.1.2.3:8000 (/opt/vllm/engine.py:42)"  # a tier's text


def _stream_events(client: httpx.Client, url: str, body: dict[str, Any]) -> list[str]:
    with client.stream("POST", url, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        return [line for line in response.iter_lines() if line.startswith("data: ")]


def _error(event: str) -> dict[str, Any]:
    return dict(json.loads(event.removeprefix("data: "))["error"])


def test_a_tiers_error_text_never_reaches_a_client_with_minimal_detail(
    make_stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    """Issue 35, item 12: a tier's JSON error body, its error event in a stream that cannot
    be continued, and its 4xx error event in one that can are each the gateway's own error."""
    tier, other = make_stub(), make_stub()
    tier.error_message = LEAK
    gateway = start_gateway(tier.url, other.url)
    url = f"{gateway}/v1/chat/completions"
    tier.mode = "server_error"  # a whole answer's error body
    answer = client.post(url, json=CHAT)
    assert answer.status_code == 500
    failed = {"message": "the model server failed", "type": "server_error", "param": None}
    assert answer.json()["error"] == {**failed, "code": "upstream_error"}
    tier.mode = "bad_request"
    answer = client.post(url, json=CHAT)
    assert answer.status_code == 400
    rejected = {"message": "the model server rejected the request", "param": "max_tokens"}
    assert answer.json()["error"] == {
        **rejected,
        "type": "invalid_request_error",
        "code": "upstream_rejected",
    }
    tier.mode = "error_event"
    events = _stream_events(client, url, {**CHAT, "n": 2})  # cannot be continued
    assert _error(events[-2])["code"] == "upstream_error" and events[-1] == "data: [DONE]"
    tier.error_code = 400  # a continuable stream's 4xx event is not continued
    events = _stream_events(client, url, CHAT)
    assert _error(events[-2])["code"] == "upstream_rejected" and events[-1] == "data: [DONE]"
    assert other.requests == []
    assert not any(LEAK in text for text in events)
    assert not any(part in answer.text for part in ("10.1.2.3", "RuntimeError"))


def test_a_tiers_error_text_reaches_clients_with_full_detail(
    make_stub: Any, start_gateway: Any, client: httpx.Client, tmp_path: Path
) -> None:
    tier, other = make_stub(), make_stub()
    tier.error_message = LEAK
    policy = _full_policy(tmp_path, "full")
    gateway = start_gateway(tier.url, other.url, policy_path=policy, watch_policy=False)
    url = f"{gateway}/v1/chat/completions"
    tier.mode = "server_error"
    assert client.post(url, json=CHAT).json()["error"]["message"] == LEAK
    tier.mode, tier.error_code = "error_event", 400
    for body in (CHAT, {**CHAT, "n": 2}):
        error = _error(_stream_events(client, url, body)[-2])
        assert (error["message"], error["code"]) == (LEAK, 400)  # as the tier sent it
