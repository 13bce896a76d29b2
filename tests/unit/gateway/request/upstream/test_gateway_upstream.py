"""The transport seam: header filtering, error translation, streamed sends to a stub tier."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gateway.config import TierEndpoint
from gateway.request.upstream.client import (
    Upstream,
    UpstreamFailed,
    UpstreamLost,
    UpstreamTimeout,
    UpstreamUnavailable,
    aclose_quietly,
    forward_headers,
    translate_error,
)

MODEL = "stub-model"
TIER = TierEndpoint(name="fp16", base_url="http://127.0.0.1:9")


def test_forward_headers_keeps_only_safe_ones() -> None:
    client_headers = {
        "Authorization": "Bearer secret",
        "Cookie": "session=1",
        "Host": "gateway.example",
        "Connection": "keep-alive",
        "Content-Length": "12",
        "Accept-Encoding": "gzip, br",
        "Content-Type": "application/json",
        "Accept": "text/event-stream",
        "TraceParent": "00-abc-def-01",
        "tracestate": "k=v",
        "X-Request-ID": "req-7",
    }
    assert forward_headers(client_headers) == {
        "content-type": "application/json",
        "accept": "text/event-stream",
        "traceparent": "00-abc-def-01",
        "tracestate": "k=v",
        "accept-encoding": "identity",  # X-Request-Id stays behind: vLLM's request id
    }


def test_forward_headers_leave_a_value_that_is_not_ascii_behind() -> None:
    """As the server decoded it (latin-1): httpx would refuse it, aiohttp re-encode it."""
    kept = forward_headers({"TraceState": "caf\xe9", "Accept": "*/*"})
    assert kept == {"accept": "*/*", "accept-encoding": "identity"}


@pytest.mark.parametrize(
    ("exc", "kind", "status"),
    [
        (httpx.ConnectError("[Errno 111] Connection refused"), UpstreamUnavailable, 503),
        (httpx.ConnectTimeout("timed out"), UpstreamUnavailable, 503),
        (httpx.ReadTimeout("timed out"), UpstreamTimeout, 504),
        (httpx.WriteTimeout("timed out"), UpstreamTimeout, 504),
        (httpx.PoolTimeout("timed out"), UpstreamTimeout, 504),
        (httpx.RemoteProtocolError("peer closed\nconnection"), UpstreamFailed, 502),
        (httpx.ReadError("reset"), UpstreamFailed, 502),
    ],
)
def test_translate_error(exc: httpx.HTTPError, kind: type[Exception], status: int) -> None:
    error = translate_error(exc, TIER)
    assert type(error) is kind
    assert error.status == status
    assert error.retryable is (kind is UpstreamUnavailable)
    assert "'fp16'" in error.message
    assert type(exc).__name__ in error.message
    assert "\n" not in error.message
    assert "127.0.0.1:9" not in error.message  # tier addresses stay in the logs


def _tier(url: str) -> TierEndpoint:
    return TierEndpoint(name="t", base_url=url)


async def _with_upstream(work: Any) -> Any:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        return await work(Upstream(client))


def test_send_opens_a_stream_and_forwards_safe_headers(stub: Any) -> None:
    tier = _tier(stub.url)
    body = {"model": MODEL, "messages": [], "stream": True}

    async def work(upstream: Upstream) -> tuple[list[bytes], bool, bool]:
        headers = {"authorization": "Bearer x", "x-request-id": "r1"}
        response = await upstream.send(tier, "POST", "/v1/chat/completions", body, headers)
        try:
            unread = not response.is_stream_consumed
            chunks = [chunk async for chunk in upstream.iter_raw(tier, response)]
        finally:
            await aclose_quietly(response)
        return chunks, unread, response.is_closed

    chunks, unread, closed = asyncio.run(_with_upstream(work))
    assert unread and closed
    assert b"".join(chunks).endswith(b"data: [DONE]\n\n")
    seen = stub.last_request["headers"]
    assert "authorization" not in seen
    assert "x-request-id" not in seen
    assert seen["accept-encoding"] == "identity"
    assert stub.last_request["body"] == body


def test_send_carries_the_tiers_own_key_never_the_clients(stub: Any) -> None:
    """A tier with ``api_key`` (the tier guard's key, backends/tier_guard.py) gets it as its
    bearer token on every call; the client's own Authorization still stays behind."""
    tier = TierEndpoint(name="t", base_url=stub.url, api_key="tier-secret")
    assert "tier-secret" not in repr(tier)

    async def work(upstream: Upstream) -> None:
        headers = {"authorization": "Bearer client-key"}
        response = await upstream.send(tier, "POST", "/v1/chat/completions", {}, headers)
        await upstream.read(tier, response)

    asyncio.run(_with_upstream(work))
    assert stub.last_request["headers"]["authorization"] == "Bearer tier-secret"


def test_send_to_a_refused_port_is_retryable(refused_url: str) -> None:
    async def work(upstream: Upstream) -> None:
        await upstream.send(_tier(refused_url), "GET", "/health")

    with pytest.raises(UpstreamUnavailable) as caught:
        asyncio.run(_with_upstream(work))
    assert caught.value.retryable
    assert caught.value.status == 503


def test_a_tier_gone_before_answering_is_retryable() -> None:
    """A server that takes the request and closes the connection without a response (a
    SIGKILLed vLLM mid-generation of a whole answer): the client has nothing yet, so the error
    is retryable (open_chain then tries the next endpoint or tier), unlike a stream broken
    after its head (test_iter_raw_translates_a_broken_stream)."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    url = f"http://127.0.0.1:{server.getsockname()[1]}"

    def take_and_drop() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.close()

    thread = threading.Thread(target=take_and_drop, daemon=True)
    thread.start()

    async def work(upstream: Upstream) -> None:
        await upstream.send(_tier(url), "POST", "/v1/chat/completions", {"x": 1})

    try:
        with pytest.raises(UpstreamLost) as caught:
            asyncio.run(_with_upstream(work))
    finally:
        thread.join(5)
        server.close()
    assert isinstance(caught.value, UpstreamUnavailable) and caught.value.retryable
    assert "went away before answering" in caught.value.message


def test_send_timeout_override(stub: Any) -> None:
    stub.mode = "hang"

    async def work(upstream: Upstream) -> None:
        await upstream.send(_tier(stub.url), "POST", "/v1/completions", {}, timeout=0.3)

    with pytest.raises(UpstreamTimeout):
        asyncio.run(_with_upstream(work))


def test_iter_raw_translates_a_broken_stream(stub: Any) -> None:
    stub.mode = "die"
    tier = _tier(stub.url)
    received: list[bytes] = []

    async def work(upstream: Upstream) -> None:
        body = {"model": MODEL, "prompt": "x", "stream": True}
        response = await upstream.send(tier, "POST", "/v1/completions", body)
        try:
            async for chunk in upstream.iter_raw(tier, response):
                received.append(chunk)
        finally:
            await aclose_quietly(response)

    with pytest.raises(UpstreamFailed):
        asyncio.run(_with_upstream(work))
    assert b"w1 " in b"".join(received)


def test_read_returns_the_body_and_closes(stub: Any) -> None:
    tier = _tier(stub.url)

    async def work(upstream: Upstream) -> tuple[bytes, bool]:
        response = await upstream.send(tier, "GET", "/v1/models")
        raw = await upstream.read(tier, response)
        return raw, response.is_closed

    raw, closed = asyncio.run(_with_upstream(work))
    assert closed
    assert b'"stub-model"' in raw
