"""Relaying a tier's answer to the client: stream or read, close.

- The tier is opened by ``open_chain`` (gateway/request/route/chain.py).
- ``UpstreamStreamingResponse`` relays SSE bytes as they come (no buffering); a tier failing
  mid-stream is continued on the next one when the request has a ``Resumer``
  (gateway/request/stream/resumable.py), else ends the stream with one SSE error event, never a
  second answer. However the stream ends (done, failed, client gone) the upstream connection is
  closed, which makes vLLM abort the generation, and the exchange it was handed is told (which
  finishes it). A stream still open when a shutdown's ``shutdown_timeout`` is up ends with an
  error event (503 ``shutting_down``) and ``[DONE]`` (gateway/serving.py).
- ``unless_client_leaves`` cancels a non-streamed exchange when the client disconnects, and
  answers 503 ``shutting_down`` when a shutdown's ``shutdown_timeout`` is up.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

import anyio
import httpx
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.config import TierEndpoint
from gateway.errors import (
    INVALID_REQUEST,
    SERVER_ERROR,
    APIError,
    error_body,
    sse_error_event,
    tier_error,
)
from gateway.request.events.sse import EventBuffer, ends_event
from gateway.request.events.sse_counter import SSECounter
from gateway.request.events.stream_usage import without_usage
from gateway.request.exchange import Exchange
from gateway.request.stream.continuation import CUT, ends_answer, split_error
from gateway.request.stream.resumable import relay_resumable, tier_error_event
from gateway.request.stream.resume import use_tier_count
from gateway.request.stream.taps import Taps
from gateway.request.upstream.client import Opened, UpstreamFailed, aclose_quietly, event_too_large
from gateway.serving import serving_state

if TYPE_CHECKING:
    from gateway.request.stream.resume import Resumer

logger = logging.getLogger(__name__)

T = TypeVar("T")
_EDGE = 32  # bytes of the previous chunk kept to find an end marker split across two
_FLUSH = 1.0  # seconds a stream ended by a shutdown is given to send its error event


class Reply(NamedTuple):
    """How the client is answered, which travels together to every kind of answer: its
    headers (``x-route-*``), the exchange its end finishes (None: nothing to finish) and
    whether a failure tells the client everything (``full``; gateway/errors.py)."""

    headers: Mapping[str, str]
    exchange: Exchange
    full: bool


def shutting_down() -> APIError:
    """What an answer still in progress when a shutdown's drain ends is told
    (gateway/serving.py): a stream in its error event, a whole answer as its status."""
    return APIError(
        503,
        "the gateway is shutting down; send the request again",
        SERVER_ERROR,
        code="shutting_down",
    )


def normalise_error(
    status: int, tier: TierEndpoint, raw: bytes, full: bool = True
) -> dict[str, Any]:
    """An upstream error body in OpenAI's nested shape (vLLM may answer flat or non-JSON).
    Without ``full`` detail the tier's text stays in the gateway's log (info): the client gets
    the gateway's own error for the status (``tier_error``)."""
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = None
    nested = payload.get("error") if isinstance(payload, dict) else None
    if not full:
        said = nested if isinstance(nested, dict) else payload
        message = said.get("message") if isinstance(said, dict) else None
        text = message if isinstance(message, str) else raw.decode("utf-8", "replace")
        text = " ".join(text.split())[:200]
        logger.info("tier %s answered HTTP %s: %s", tier.name, status, text)
        param = said.get("param") if isinstance(said, dict) else None
        return tier_error(status, text, param).body(full=False)
    if isinstance(nested, dict):
        return cast(dict[str, Any], payload)
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


def whole_response(
    tier: TierEndpoint, upstream_response: httpx.Response, raw: bytes, reply: Reply
) -> WholeAnswer:
    """Relay a complete upstream answer with its status; errors keep OpenAI's shape. The
    answer finishes ``reply.exchange`` once sent."""
    status = upstream_response.status_code
    headers, exchange = reply.headers, reply.exchange
    if status >= 400:
        body = normalise_error(status, tier, raw, reply.full)
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


async def relay_sse(opened: Opened, taps: Taps) -> AsyncGenerator[bytes, None]:
    """Yield upstream bytes as they arrive; a failure mid-stream ends with an SSE error event,
    as does a stream that closes with neither a finish_reason nor ``[DONE]`` (cut mid-answer).
    Without ``full`` detail complete events are relayed, so that a tier's own error event is
    replaced by the gateway's (``tier_error_event``); with it, bytes as they come."""
    upstream, tier, response = opened.upstream, opened.tier, opened.response
    counter, on_first_byte, full = taps
    tail = b"\n\n"
    ended = False  # a finish_reason or [DONE] went by (looked for across chunk edges too)
    buffer = EventBuffer()  # without full detail: what followed the last event boundary
    try:
        async with aclosing(upstream.iter_raw(tier, response)) as chunks:
            async for chunk in chunks:
                if not chunk:
                    continue
                if on_first_byte is not None:
                    on_first_byte()
                    on_first_byte = None
                failure = None
                if not full:
                    chunk = buffer.feed(chunk)
                    chunk, failure = split_error(chunk)
                if chunk:
                    counter.feed(chunk)
                    if not ended:
                        ended = ends_answer(chunk) or ends_answer(tail + chunk[:_EDGE])
                    tail = (tail + chunk[-_EDGE:])[-_EDGE:]
                    yield chunk
                if failure is not None:
                    counter.failure = failure.status or 502
                    yield tier_error_event(tier, failure, full)
                    return
                if buffer.held > upstream.max_answer_bytes:  # the events before it went
                    raise event_too_large(tier, upstream.max_answer_bytes)
        if pending := buffer.rest():
            counter.feed(pending)
            ended = ended or ends_answer(tail + pending)
            tail = (tail + pending[-_EDGE:])[-_EDGE:]
            yield pending
        if not ended:
            logger.warning("tier %s: %s", tier.name, CUT)
            raise UpstreamFailed(tier.name, CUT)
        counter.completed = True
    except APIError as exc:
        counter.failure = exc.status
        separator = b"" if ends_event(tail) else b"\n\n"
        yield separator + sse_error_event(exc, full)
    finally:
        await aclose_quietly(response)


class UpstreamStreamingResponse(StreamingResponse):
    """Streams a tier's SSE answer; the upstream is closed however the stream ends."""

    def __init__(
        self,
        opened: Opened,
        reply: Reply | None = None,
        resumer: Resumer | None = None,
        usage_asked: bool = True,
    ) -> None:
        """``reply``: its headers, the exchange the stream's end finishes, and whether a
        failure mid-stream tells the client everything (see gateway/errors.py); ``resumer``:
        continues the answer on another tier when its own fails mid-stream; ``usage_asked``
        False: the gateway asked the tier for the usage event, which the client is not sent
        (gateway/request/events/stream_usage.py; with a ``resumer`` only)."""
        exchange = reply.exchange if reply is not None else None
        full = reply.full if reply is not None else True
        self._upstream_response = opened.response
        self._exchange = exchange
        self._counter = SSECounter()
        self._resumer = resumer
        first_byte = None
        if exchange is not None:
            exchange.hand_to_stream()
            first_byte = exchange.first_byte
        taps = Taps(self._counter, first_byte, full)
        if resumer is None:
            self._chunks = relay_sse(opened, taps)
        else:
            self._chunks = relay_resumable(opened, taps, resumer)
            if not usage_asked:
                self._chunks = without_usage(self._chunks)
        super().__init__(
            self._chunks,
            status_code=opened.response.status_code,
            media_type="text/event-stream",
            headers={**(reply.headers if reply is not None else {}), "cache-control": "no-cache"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Starlette's own __call__ runs the stream and a disconnect listener as a task group of
        # two (uvicorn speaks ASGI 2.3); the stream runs here, cancelled by one watcher task.
        # A send that fails (ASGI 2.4 servers raise OSError once the client has gone) is the
        # client's disconnect, as in Starlette.
        # A shutdown that outlasts shutdown_timeout ends the stream (gateway/serving.py): it is
        # cancelled like a disconnect, then told why in an error event and [DONE].
        serving = serving_state()
        shut: list[bool] = []
        try:
            serving_drained_first = serving.drained
            if serving_drained_first:  # the server is past its drain deadline: nothing relayed
                shut.append(True)
            else:
                with anyio.CancelScope() as cancel:

                    def end() -> None:
                        shut.append(True)
                        cancel.cancel()

                    serving.track(self, end)
                    watcher = asyncio.get_running_loop().create_task(
                        _cancel_on_disconnect(receive, cancel)
                    )
                    try:
                        await self.stream_response(send)
                    except OSError as exc:
                        raise ClientDisconnect() from exc
                    finally:
                        watcher.cancel()
                        serving.untrack(self)
            if shut:
                self._counter.failure = 503
                await self._end_for_shutdown(send, started=not serving_drained_first)
        finally:
            # A client disconnect cancels the streaming task; close what it left open,
            # which drops the tier connection so vLLM aborts the generation.
            with anyio.CancelScope(shield=True):
                await self._chunks.aclose()
                await aclose_quietly(self._upstream_response)
                if self._exchange is not None:
                    counter = self._counter
                    use_tier_count(self._exchange, counter.prompt_tokens, self._resumer)
                    await self._exchange.stream_ended(counter.status, counter.tokens)

    async def _end_for_shutdown(self, send: Send, started: bool) -> None:
        """End the stream with the shutdown's error event and [DONE], within ``_FLUSH``
        seconds (a client that does not read is not waited for). The blank line first ends an
        event the tier's last chunk may have left open (a spare one is ignored)."""
        with anyio.move_on_after(_FLUSH):
            try:
                if not started:
                    await send(
                        {
                            "type": "http.response.start",
                            "status": self.status_code,
                            "headers": self.raw_headers,
                        }
                    )
                event = b"\n\n" + sse_error_event(shutting_down(), True)
                await send({"type": "http.response.body", "body": event, "more_body": False})
            except (OSError, RuntimeError):
                pass  # the client is gone, or the answer had just ended (uvicorn refuses more)


async def unless_client_leaves(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """Run ``work`` but cancel it (returning None) if the client disconnects first.

    Cancelling an upstream exchange closes its connection, which makes vLLM abort the request;
    without this a client that gave up would keep a tier busy until the answer was complete.
    ``work`` runs in this task, inside a cancel scope that a watcher task cancels on the
    client's disconnect (one task a request, not a task group of two).
    """
    serving = serving_state()
    shut: list[bool] = []
    with anyio.CancelScope() as scope:

        def end() -> None:
            shut.append(True)
            scope.cancel()

        serving.track(scope, end)  # a shutdown's deadline ends it too (gateway/serving.py)
        watcher = asyncio.get_running_loop().create_task(
            _cancel_on_disconnect(request.receive, scope)
        )
        try:
            return await work()
        finally:
            watcher.cancel()
            serving.untrack(scope)
    if shut:
        raise shutting_down()
    return None  # the scope was cancelled: the client left


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
