"""``CompletionRoutes`` (gateway/request/completions/fast_routes.py): POST to a completion path is
answered by its endpoint, an ``APIError`` in OpenAI's shape; everything else goes on to the app."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.errors import APIError, exception_handlers
from gateway.request.completions.fast_routes import CompletionRoutes


async def _answer(request: Request) -> Response:
    if request.headers.get("x-fail") == "api":
        raise APIError(429, "slow down", code="rate_limited", headers={"Retry-After": "2"})
    if request.headers.get("x-fail") == "bug":
        raise ZeroDivisionError("a bug")
    return JSONResponse({"answered": request.url.path, "body": (await request.body()).decode()})


def _run(method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any, list]:
    passed: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        passed.append(f"{scope['method']} {scope['path']}")
        await JSONResponse({"router": True}, status_code=405)(scope, receive, send)

    routes = CompletionRoutes(app, {"/v1/chat/completions": _answer})
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    raw = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": method, "path": path, "headers": raw, "query_string": b""}
    asyncio.run(routes(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    start = sent[0]
    return start["status"], (json.loads(body), dict(start["headers"])), passed


def test_a_post_to_a_completion_path_is_answered_by_its_endpoint() -> None:
    status, (body, _), passed = _run("POST", "/v1/chat/completions")
    assert (status, body, passed) == (200, {"answered": "/v1/chat/completions", "body": "{}"}, [])


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/v1/chat/completions"), ("POST", "/v1/other")]
)
def test_anything_else_goes_on_to_the_app(method: str, path: str) -> None:
    status, (body, _), passed = _run(method, path)
    assert (status, body, passed) == (405, {"router": True}, [f"{method} {path}"])


def test_an_api_error_is_answered_in_openais_shape() -> None:
    status, (body, headers), _ = _run("POST", "/v1/chat/completions", {"x-fail": "api"})
    assert status == 429
    assert body["error"]["code"] == "rate_limited" and body["error"]["message"] == "slow down"
    assert headers[b"retry-after"] == b"2"


def test_any_other_error_goes_on_up() -> None:
    """To Starlette's server-error middleware, which answers 500 and logs it."""
    with pytest.raises(ZeroDivisionError):
        _run("POST", "/v1/chat/completions", {"x-fail": "bug"})


def test_inside_starlette_errors_keep_openais_shape() -> None:
    """Mounted as the app mounts it: a crash is Starlette's 500 in OpenAI's shape (nothing of
    the exception shown), a GET is the router's 405, a POST elsewhere its 404."""

    async def crash(request: Request) -> Response:
        raise RuntimeError("secret internals")

    endpoints = {"/v1/chat/completions": crash}
    app = Starlette(
        routes=[Route(p, e, methods=["POST"]) for p, e in endpoints.items()],
        middleware=[Middleware(CompletionRoutes, endpoints=endpoints)],
        exception_handlers=exception_handlers(),
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        crashed = client.post("/v1/chat/completions", json={})
        assert crashed.status_code == 500
        assert crashed.json()["error"]["code"] == "internal_error"
        assert "secret" not in crashed.text
        wrong_method = client.get("/v1/chat/completions")
        assert (wrong_method.status_code, wrong_method.headers["allow"]) == (405, "POST")
        assert client.post("/v1/elsewhere", json={}).json()["error"]["code"] == "not_found"
