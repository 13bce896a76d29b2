"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``, as JSON or SSE."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {...}}``."""
        return error_body(self.message, self.type, self.param, self.code)


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


def api_error_response(exc: APIError) -> JSONResponse:
    """The JSON response for an ``APIError``."""
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers or None)


def sse_error_event(exc: APIError) -> bytes:
    """The SSE bytes ending a stream that failed after it started: an error event, then [DONE]."""
    payload = json.dumps(exc.body(), separators=(",", ":"))
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


async def _handle_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return api_error_response(exc)


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
        APIError: _handle_api_error,
        HTTPException: _handle_http_exception,
        Exception: _handle_unexpected,
    }
