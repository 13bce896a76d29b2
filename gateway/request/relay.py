"""Relaying one request to its chain of tiers: open, fall back, stream or read, close.

- ``open_chain`` tries the plan's tiers in order, each tier's endpoints in the order the
  endpoint choice gave; a connect error or a 503 before the first byte moves on to the next
  endpoint of the tier, then to the next tier. Once one has answered, that answer is the answer.
- ``UpstreamStreamingResponse`` relays SSE bytes as they come (no buffering); a tier failing
  mid-stream ends the stream with one SSE error event, never a second answer. However the
  stream ends (done, failed, client gone) the upstream connection is closed, which makes vLLM
  abort the generation, and the exchange it was handed is told (which finishes it).
- ``unless_client_leaves`` cancels a non-streamed exchange when the client disconnects.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import httpx
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.config import TierEndpoint
from gateway.errors import INVALID_REQUEST, SERVER_ERROR, APIError, error_body, sse_error_event
from gateway.request.continuation import complete_events
from gateway.request.exchange import Exchange, SSECounter
from gateway.request.stream_watch import Degenerated
from gateway.request.upstream import Upstream, UpstreamLost, UpstreamUnavailable, aclose_quietly

if TYPE_CHECKING:
    from gateway.request.resume import Resumer

logger = logging.getLogger(__name__)

T = TypeVar("T")
NO_SERVER = "no model server is available; retry shortly"  # what clients are told


async def open_chain(
    upstream: Upstream,
    tiers: list[list[TierEndpoint]],
    body_for: Callable[[str], Any],
    path: str,
    headers: Mapping[str, str],
    exchange: Exchange,
    first_byte: float = float("inf"),
) -> tuple[TierEndpoint, httpx.Response]:
    """Open the request on the first endpoint that connects, answers within ``first_byte``
    seconds and does not answer 503. ``tiers``: the chain, each tier as its endpoints in the
    order to try (gateway/request/endpoint_choice.py; one for a single-server tier), so a
    failing endpoint moves on to the next endpoint of its tier before the next tier. Returns
    the endpoint that answered (its ``base_url`` is the endpoint's URL) and its response."""
    failures: list[str] = []
    for endpoints in tiers:
        if not endpoints:
            continue
        await exchange.acquire(endpoints[0].name)
        for tier in endpoints:
            where = _where(tier, len(endpoints))
            response = None
            # No cancel scope for a whole answer (no first-byte bound): one costs CPU per request.
            bound = nullcontext() if first_byte == float("inf") else anyio.move_on_after(first_byte)
            try:
                with bound:
                    response = await upstream.send(tier, "POST", path, body_for(tier.name), headers)
            except UpstreamLost:
                failures.append(f"{where} went away before answering")
                exchange.fell_back(tier.name, "lost")
                continue
            except UpstreamUnavailable:
                failures.append(f"{where} unreachable")
                exchange.fell_back(tier.name, "unreachable")
                continue
            if response is None:  # cancelling the send closed its connection: vLLM aborts
                failures.append(f"{where} did not answer within {first_byte:g} s")
                exchange.fell_back(tier.name, "timeout")
                continue
            if response.status_code == 503:
                await aclose_quietly(response)
                failures.append(f"{where} answered 503")
                exchange.fell_back(tier.name, "503")
                continue
            return tier, response
    await exchange.release()
    raise APIError(
        503,
        f"no tier is available ({', '.join(failures) or 'no endpoint is ready'}); retry shortly",
        SERVER_ERROR,
        code="no_tier_available",
        headers={"Retry-After": "5"},
        public=NO_SERVER,
    )


def _where(endpoint: TierEndpoint, pool_size: int) -> str:
    """A failure's place: the tier, and the endpoint when its pool has several."""
    return endpoint.name if pool_size == 1 else f"{endpoint.name} at {endpoint.base_url}"


def normalise_error(
    status: int, tier: TierEndpoint, raw: bytes, full: bool = True
) -> dict[str, Any]:
    """An upstream error body in OpenAI's nested shape (vLLM may answer flat or non-JSON; a
    body that is not an error object is quoted only with ``full`` detail)."""
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
    if not full:
        return error_body(f"the model server answered HTTP {status}", kind)
    text = " ".join(raw.decode("utf-8", "replace").split())[:200]
    return error_body(f"tier '{tier.name}' answered HTTP {status}: {text}", kind)


def whole_response(
    tier: TierEndpoint,
    upstream_response: httpx.Response,
    raw: bytes,
    headers: Mapping[str, str],
    full: bool = True,
    exchange: Exchange | None = None,
) -> WholeAnswer:
    """Relay a complete upstream answer with its status; errors keep OpenAI's shape. Handed
    ``exchange``, the answer finishes it once sent."""
    status = upstream_response.status_code
    if status >= 400:
        body = normalise_error(status, tier, raw, full)
        content = bytes(JSONResponse(body).body)  # JSONResponse's own encoding
        return WholeAnswer(content, status, "application/json", headers, exchange)
    media_type = upstream_response.headers.get("content-type", "application/json")
    return WholeAnswer(raw, status, media_type, headers, exchange)


class WholeAnswer(Response):
    """A whole answer that finishes its exchange once sent, however the sending ends: the
    bookkeeping (metrics, spans, the in-flight slot; gateway/request/exchange.py) runs after
    the answer is on its way instead of in front of it, as it does for a stream. The same
    task goes on to it without waiting for anything, so a client that reads /metrics after
    its answer still finds the request counted."""

    def __init__(
        self,
        content: bytes,
        status_code: int,
        media_type: str,
        headers: Mapping[str, str],
        exchange: Exchange | None = None,
    ) -> None:
        super().__init__(content, status_code, dict(headers), media_type)
        self._exchange = exchange
        if exchange is not None:
            exchange.hand_to_answer()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._exchange is not None:
                with anyio.CancelScope(shield=True):
                    await self._exchange.answer_sent()


async def relay_sse(
    upstream: Upstream,
    tier: TierEndpoint,
    response: httpx.Response,
    counter: SSECounter | None = None,
    on_first_byte: Callable[[], None] | None = None,
    full: bool = True,
    resumer: Resumer | None = None,
) -> AsyncGenerator[bytes, None]:
    """Yield upstream bytes as they arrive; a failure mid-stream is continued on another tier
    by ``resumer`` when it can be (gateway/request/resume.py), else ends with an SSE error
    event. With a ``resumer``, only complete events are forwarded (a tier failing mid-event
    leaves the client nothing it cannot read) and the forwarded events are kept."""
    sent: list[bytes] | None = None if resumer is None else []
    rewrite: Callable[[bytes], bytes] | None = None
    tail = b"\n\n"
    preface = b""  # what goes before a continuation's events (the SSE comment saying so)
    while True:
        pending = b""
        # A watched tier's text is checked and held back before it is sent (stream_watch.py).
        watch = resumer.watch if resumer is not None and resumer.watches(tier) else None
        try:
            if preface:  # in the try: a client leaving here still closes the new response
                yield preface
            async with aclosing(upstream.iter_raw(tier, response)) as chunks:
                async for chunk in chunks:
                    if not chunk:
                        continue
                    if on_first_byte is not None:
                        on_first_byte()
                        on_first_byte = None
                    if sent is not None:
                        chunk, pending = complete_events(pending + chunk)
                        if rewrite is not None:
                            chunk = rewrite(chunk)
                        if watch is not None:
                            chunk = watch.feed(chunk)
                        if chunk:
                            sent.append(chunk)
                        if watch is not None and watch.verdict is not None:
                            if chunk:
                                yield chunk
                            raise Degenerated(tier.name, watch.verdict)
                        if not chunk:
                            continue
                    if counter is not None:
                        counter.feed(chunk)
                    tail = (tail + chunk)[-2:]
                    yield chunk
            if watch is not None and (held := watch.flush()):
                yield held
            if pending and rewrite is None:
                yield pending  # what followed the last event boundary, as the tier sent it
            if counter is not None:
                counter.completed = True
            return
        except APIError as exc:
            going_on = None
            if resumer is not None and sent is not None:
                if resumer.watch is not None:
                    resumer.watch.resume()
                going_on = await resumer.resume(tier, sent, exc)
            if going_on is None:
                if counter is not None:
                    counter.failure = exc.status
                separator = b"" if tail == b"\n\n" else b"\n\n"
                yield separator + sse_error_event(exc, full)
                return
        finally:
            await aclose_quietly(response)
        if going_on.tier is None or going_on.response is None:
            if counter is not None:
                counter.completed = True
            yield going_on.closing
            return
        tier, response, rewrite = going_on.tier, going_on.response, going_on.rewrite
        preface = going_on.closing


class UpstreamStreamingResponse(StreamingResponse):
    """Streams a tier's SSE answer; the upstream is closed however the stream ends."""

    def __init__(
        self,
        upstream: Upstream,
        tier: TierEndpoint,
        response: httpx.Response,
        headers: Mapping[str, str] | None = None,
        exchange: Exchange | None = None,
        full: bool = True,
        resumer: Resumer | None = None,
    ) -> None:
        """``full``: a failure mid-stream tells the client everything (see gateway/errors.py);
        ``resumer``: continues the answer on another tier when its own fails mid-stream."""
        self._upstream_response = response
        self._exchange = exchange
        self._counter = SSECounter()
        first_byte = None
        if exchange is not None:
            exchange.hand_to_stream()
            first_byte = exchange.first_byte
        self._chunks = relay_sse(upstream, tier, response, self._counter, first_byte, full, resumer)
        super().__init__(
            self._chunks,
            status_code=response.status_code,
            media_type="text/event-stream",
            headers={**(headers or {}), "cache-control": "no-cache"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Starlette's own __call__ runs the stream and a disconnect listener as a task group of
        # two (uvicorn speaks ASGI 2.3); the stream runs here, cancelled by one watcher task.
        # A send that fails (ASGI 2.4 servers raise OSError once the client has gone) is the
        # client's disconnect, as in Starlette.
        try:
            with anyio.CancelScope() as cancel:
                watcher = asyncio.get_running_loop().create_task(
                    _cancel_on_disconnect(receive, cancel)
                )
                try:
                    await self.stream_response(send)
                except OSError as exc:
                    raise ClientDisconnect() from exc
                finally:
                    watcher.cancel()
        finally:
            # A client disconnect cancels the streaming task; close what it left open,
            # which drops the tier connection so vLLM aborts the generation.
            with anyio.CancelScope(shield=True):
                await self._chunks.aclose()
                await aclose_quietly(self._upstream_response)
                if self._exchange is not None:
                    await self._exchange.stream_ended(self._counter.status, self._counter.tokens)


async def unless_client_leaves(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """Run ``work`` but cancel it (returning None) if the client disconnects first.

    Cancelling an upstream exchange closes its connection, which makes vLLM abort the request;
    without this a client that gave up would keep a tier busy until the answer was complete.
    ``work`` runs in this task, inside a cancel scope that a watcher task cancels on the
    client's disconnect (one task a request, not a task group of two).
    """
    with anyio.CancelScope() as scope:
        watcher = asyncio.get_running_loop().create_task(
            _cancel_on_disconnect(request.receive, scope)
        )
        try:
            return await work()
        finally:
            watcher.cancel()
    return None  # the scope was cancelled: the client left


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
