"""OpenAI API endpoints: check the request, open a tier, relay its answer (streamed or whole)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import Any, TypeVar

import anyio
import httpx
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.config import TierEndpoint
from gateway.errors import INVALID_REQUEST, SERVER_ERROR, APIError, error_body, sse_error_event
from gateway.state import get_config, get_tier_states, get_upstream
from gateway.tiers import available_tiers
from gateway.upstream import Upstream, UpstreamUnavailable, aclose_quietly

logger = logging.getLogger(__name__)

TIER_HEADER = "x-route-tier"

T = TypeVar("T")


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, or 413 as soon as it is known to exceed ``max_bytes``."""
    too_large = APIError(413, f"request body exceeds {max_bytes} bytes", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_bytes:
                raise too_large
    except ClientDisconnect as exc:
        raise APIError(400, "client disconnected while sending the request body") from exc
    return bytes(body)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Decode a JSON object body; anything else is a one-line 400."""
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise APIError(
            400,
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
        ) from exc
    except ValueError as exc:  # e.g. bytes that are not UTF-8/16/32
        raise APIError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def check_model(body: dict[str, Any], model_name: str) -> dict[str, Any]:
    """Require ``model`` to be the served model (missing means it); returns the body to send."""
    model = body.get("model")
    if model is None:
        return {**body, "model": model_name}
    if not isinstance(model, str):
        raise APIError(400, "'model' must be a string", param="model", code="invalid_type")
    if model != model_name:
        raise APIError(
            404,
            f"The model '{model}' does not exist; this gateway serves '{model_name}'",
            param="model",
            code="model_not_found",
        )
    return body


def wants_stream(body: Mapping[str, Any]) -> bool:
    """True when the client asked for server-sent events."""
    return body.get("stream") is True


def candidates(request: Request) -> list[TierEndpoint]:
    """The configured tiers that may take a request now (ready ones, in order)."""
    tiers = available_tiers(get_config(request).tiers, get_tier_states(request))
    if not tiers:
        raise APIError(
            503,
            "no tier is ready; retry shortly",
            SERVER_ERROR,
            code="no_tier_available",
            headers={"Retry-After": "5"},
        )
    return tiers


async def open_first_available(
    upstream: Upstream,
    tiers: Sequence[TierEndpoint],
    method: str,
    path: str,
    json_body: Any,
    headers: Mapping[str, str],
) -> tuple[TierEndpoint, httpx.Response]:
    """Open the request on the first tier that connects and does not answer 503."""
    failures: list[str] = []
    for tier in tiers:
        try:
            response = await upstream.send(tier, method, path, json_body, headers)
        except UpstreamUnavailable:
            failures.append(f"{tier.name} unreachable")
            continue
        if response.status_code == 503:
            await aclose_quietly(response)
            failures.append(f"{tier.name} answered 503")
            continue
        return tier, response
    raise APIError(
        503,
        f"no tier is available ({', '.join(failures)})",
        SERVER_ERROR,
        code="no_tier_available",
    )


def normalise_error(status: int, tier: TierEndpoint, raw: bytes) -> dict[str, Any]:
    """An upstream error body in OpenAI's nested shape (vLLM may answer flat or non-JSON)."""
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        return payload
    kind = SERVER_ERROR if status >= 500 else INVALID_REQUEST
    if isinstance(payload, dict) and isinstance(payload.get("message"), str):
        code = payload.get("code")
        return error_body(
            payload["message"],
            str(payload.get("type") or kind),
            payload.get("param") if isinstance(payload.get("param"), str) else None,
            code if isinstance(code, str) else None,
        )
    text = " ".join(raw.decode("utf-8", "replace").split())[:200]
    return error_body(f"tier '{tier.name}' answered HTTP {status}: {text}", kind)


def whole_response(tier: TierEndpoint, upstream_response: httpx.Response, raw: bytes) -> Response:
    """Relay a complete upstream answer with its status; errors keep OpenAI's shape."""
    status = upstream_response.status_code
    headers = {TIER_HEADER: tier.name}
    if status >= 400:
        return JSONResponse(normalise_error(status, tier, raw), status_code=status, headers=headers)
    media_type = upstream_response.headers.get("content-type", "application/json")
    return Response(raw, status_code=status, media_type=media_type, headers=headers)


async def relay_sse(
    upstream: Upstream, tier: TierEndpoint, response: httpx.Response
) -> AsyncGenerator[bytes, None]:
    """Yield upstream bytes as they arrive; a failure mid-stream ends with an SSE error event."""
    tail = b"\n\n"
    try:
        async with aclosing(upstream.iter_raw(tier, response)) as chunks:
            async for chunk in chunks:
                if chunk:
                    tail = (tail + chunk)[-2:]
                    yield chunk
    except APIError as exc:
        separator = b"" if tail == b"\n\n" else b"\n\n"
        yield separator + sse_error_event(exc)
    finally:
        await aclose_quietly(response)


class UpstreamStreamingResponse(StreamingResponse):
    """Streams a tier's SSE answer; the upstream is closed however the stream ends."""

    def __init__(self, upstream: Upstream, tier: TierEndpoint, response: httpx.Response) -> None:
        self._upstream_response = response
        self._chunks = relay_sse(upstream, tier, response)
        super().__init__(
            self._chunks,
            status_code=response.status_code,
            media_type="text/event-stream",
            headers={TIER_HEADER: tier.name, "cache-control": "no-cache"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # A client disconnect cancels the streaming task; close what it left open,
            # which drops the tier connection so vLLM aborts the generation.
            with anyio.CancelScope(shield=True):
                await self._chunks.aclose()
            await aclose_quietly(self._upstream_response)


async def unless_client_leaves(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """Run ``work`` but cancel it (returning None) if the client disconnects first.

    Cancelling an upstream exchange closes its connection, which makes vLLM abort the request;
    without this a client that gave up would keep a tier busy until the answer was complete.
    """
    outcome: list[T] = []
    failure: list[Exception] = []
    async with anyio.create_task_group() as group:

        async def run() -> None:
            try:
                outcome.append(await work())
            except Exception as exc:  # re-raised below, outside the task group
                failure.append(exc)
            group.cancel_scope.cancel()

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            group.cancel_scope.cancel()

        group.start_soon(run)
        group.start_soon(watch)
    if failure:
        raise failure[0]
    return outcome[0] if outcome else None


async def _relay_completion(request: Request, path: str) -> Response:
    config = get_config(request)
    upstream = get_upstream(request)
    body = check_model(
        parse_json_object(await read_body(request, config.max_body_bytes)), config.model_name
    )

    async def exchange() -> Response:
        tier, response = await open_first_available(
            upstream, candidates(request), "POST", path, body, request.headers
        )
        if wants_stream(body) and response.status_code == 200:
            # From here on the streaming response owns the upstream and watches the client.
            return UpstreamStreamingResponse(upstream, tier, response)
        return whole_response(tier, response, await upstream.read(tier, response))

    answer = await unless_client_leaves(request, exchange)
    if answer is None:
        logger.info("client left %s before the answer; upstream request closed", path)
        return Response(status_code=499)  # nobody is listening any more
    return answer


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    return await _relay_completion(request, "/v1/chat/completions")


async def completions(request: Request) -> Response:
    """``POST /v1/completions``."""
    return await _relay_completion(request, "/v1/completions")


async def list_models(request: Request) -> Response:
    """``GET /v1/models``: the first reachable tier's entry for the served model."""
    config = get_config(request)
    upstream = get_upstream(request)
    tier, response = await open_first_available(
        upstream, candidates(request), "GET", "/v1/models", None, request.headers
    )
    raw = await upstream.read(tier, response)
    if response.status_code != 200:
        return whole_response(tier, response, raw)
    try:
        payload = json.loads(raw)
        listed = [entry for entry in payload["data"] if isinstance(entry, dict)]
    except (ValueError, KeyError, TypeError) as exc:
        raise APIError(
            502,
            f"tier '{tier.name}' sent a malformed /v1/models answer",
            SERVER_ERROR,
            code="upstream_error",
        ) from exc
    served = [entry for entry in listed if entry.get("id") == config.model_name]
    if not served:
        ids = ", ".join(str(entry.get("id")) for entry in listed) or "nothing"
        raise APIError(
            502,
            f"tier '{tier.name}' does not serve model '{config.model_name}' (it lists {ids})",
            SERVER_ERROR,
            code="model_mismatch",
        )
    return JSONResponse({"object": "list", "data": served}, headers={TIER_HEADER: tier.name})
