"""OpenAI's error shape as JSON, as an SSE event, and from the exception handlers."""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

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
