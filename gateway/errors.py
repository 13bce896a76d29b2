"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``, as JSON or SSE.

How much a client is told is the routing policy's ``errors.detail`` (policies/routing.yaml):
an ``APIError`` whose message names the gateway's insides (tiers, their addresses, what failed)
carries a ``public`` message too, which clients see unless the request's state says ``full``
(``FULL_DETAIL``: set by the proxy from the policy, or by gateway/auth.py for a request sending
an admin key); the ``x-route-reason`` header goes only with full detail. The full message of an
error a client was not shown is logged.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
ROUTE_REASON = "x-route-reason"
DETAIL = "error_detail"  # the request state's key: "full" shows everything
FULL_DETAIL = "full"


class APIError(Exception):
    """An error returned to the client in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        public: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.public = public  # what a client without full detail is told (None: the message)

    def body(self, full: bool = True) -> dict[str, Any]:
        """The JSON body: ``{"error": {...}}``; without ``full``, the public message."""
        message = self.message if full or self.public is None else self.public
        return error_body(message, self.type, self.param, self.code)


def error_body(
    message: str,
    type: str = INVALID_REQUEST,
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    type: str = INVALID_REQUEST,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """A JSON response carrying OpenAI's error object."""
    return JSONResponse(error_body(message, type, param, code), status_code=status, headers=headers)


def api_error_response(exc: APIError, full: bool = True) -> JSONResponse:
    """The JSON response for an ``APIError`` (without ``full``: public message, no reason)."""
    headers = exc.headers if full else {k: v for k, v in exc.headers.items() if k != ROUTE_REASON}
    return JSONResponse(exc.body(full), status_code=exc.status, headers=headers or None)


def sse_error_event(exc: APIError, full: bool = True) -> bytes:
    """The SSE bytes ending a stream that failed after it started: an error event, then [DONE]."""
    payload = json.dumps(exc.body(full), separators=(",", ":"))
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()


UPSTREAM_REJECTED = "upstream_rejected"  # a tier refused the request (its 4xx)
UPSTREAM_ERROR = "upstream_error"  # a tier failed (its 5xx, a broken or malformed answer)
_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_.\[\]]{0,63}")  # a field's name, nothing more


def tier_error(status: int, message: str, param: object = None) -> APIError:
    """A tier's own error (its JSON error body or SSE error event, with the ``status`` it
    answered or its event's code) as the gateway's: clients without full detail are told
    only what kind of failure it was, never the tier's text (vLLM's 500s carry exception
    text, addresses); ``param`` is kept when it is a field's name."""
    field = param if isinstance(param, str) and _PARAM.fullmatch(param) else None
    if 400 <= status < 500:
        public = "the model server rejected the request"
        return APIError(status, message, INVALID_REQUEST, field, UPSTREAM_REJECTED, public=public)
    return APIError(
        status, message, SERVER_ERROR, code=UPSTREAM_ERROR, public="the model server failed"
    )


def full_detail(request: Request) -> bool:
    """Whether ``request`` may be told everything (see the module docstring)."""
    return bool(request.scope.get("state", {}).get(DETAIL) == FULL_DETAIL)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


async def handle_api_error(request: Request, exc: Exception) -> Response:
    """The response for an ``APIError`` raised by an endpoint (the app's handler)."""
    assert isinstance(exc, APIError)
    full = full_detail(request)
    if not full and exc.public is not None:
        logger.info("%s %s: %s (the client was told: %s)", request.method, request.url.path,
                    exc.message, exc.public)  # fmt: skip
    return api_error_response(exc, full)


async def _handle_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"Invalid URL ({request.method} {request.url.path})"
    elif exc.status_code == 405:
        message = f"Method {request.method} not allowed for {request.url.path}"
    else:
        message = str(exc.detail)
    kind = SERVER_ERROR if exc.status_code >= 500 else INVALID_REQUEST
    return error_response(
        exc.status_code, message, kind, code=_HTTP_CODES.get(exc.status_code), headers=exc.headers
    )


async def _handle_unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal gateway error", SERVER_ERROR, code="internal_error")


def exception_handlers() -> dict[Any, Any]:
    """Handlers for ``Starlette(exception_handlers=...)`` so every error has OpenAI's shape."""
    return {
        APIError: handle_api_error,
        HTTPException: _handle_http_exception,
        Exception: _handle_unexpected,
    }
