"""The gateway's uvicorn settings (gateway/server.py) on a real server on 127.0.0.1: time and
size limits on request heads, connections per client, the concurrency and keep-alive limits,
and whose X-Forwarded-For is believed — with both HTTP parsers (httptools, h11) where the limit
is the gateway's own code."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from typing import Any

import httpx
import pytest

from gateway.config import GatewayConfig, TierEndpoint
from gateway.server import (
    ConnectionLimits,
    GatewayHttpToolsProtocol,
    GatewayProtocol,
    server_options,
)

WAIT = 10.0
CHAT = {"messages": [{"role": "user", "content": "Capital of France?"}]}
PARSERS = pytest.mark.parametrize("parser", ["httptools", "h11"])


def _connect(gateway: str) -> socket.socket:
    host, port = gateway.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=WAIT)


def _closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> float | None:
    """Seconds until the server closed ``sock`` (sending ``trickle`` a byte at a time, one
    every 0.1 s), or None if it was still open after ``seconds``."""
    started = time.monotonic()
    sock.settimeout(0.1)
    sent = 0
    while time.monotonic() - started < seconds:
        try:
            if not sock.recv(65536):
                return time.monotonic() - started
        except TimeoutError:
            pass
        except ConnectionResetError:
            return time.monotonic() - started
        if sent < len(trickle):
            try:
                sock.sendall(trickle[sent : sent + 1])
            except OSError:
                return time.monotonic() - started
            sent += 1
    return None


def test_options_set_every_limit_deliberately() -> None:
    config = GatewayConfig(
        model_name="m",
        tiers=[TierEndpoint(name="t0", base_url="http://127.0.0.1:9")],
        max_connections=500,
        keep_alive_timeout=7,
    )
    options = server_options(config)
    assert options["limit_concurrency"] == 500
    assert options["timeout_keep_alive"] == 7
    assert options["proxy_headers"] is False  # X-Forwarded-For believed from nobody
    assert options["server_header"] is False
    assert options["access_log"] is False  # the request log samples instead
    assert options["loop"] == "uvloop"
    assert issubclass(options["http"], GatewayHttpToolsProtocol)
    assert options["http"].max_head_bytes == options["h11_max_incomplete_event_size"] == 65_536
    assert options["http"].send_timeout == 60.0  # NGINX's send_timeout default
    assert options["http"].shutdown_timeout == 20.0
    assert options["timeout_graceful_shutdown"] == 22.0  # below the 30 s grace periods
    h11 = server_options(config.model_copy(update={"http_parser": "h11", "event_loop": "asyncio"}))
    assert issubclass(h11["http"], GatewayProtocol)
    assert h11["loop"] == "asyncio"
    assert all(issubclass(o["http"], ConnectionLimits) for o in (options, h11))
    trusting = server_options(config.model_copy(update={"forwarded_allow_ips": ["10.0.0.0/8"]}))
    assert trusting["proxy_headers"] is True
    assert trusting["forwarded_allow_ips"] == ["10.0.0.0/8"]


@PARSERS
def test_a_request_head_sent_slowly_is_cut_off(stub: Any, start_gateway: Any, parser: str) -> None:
    gateway = start_gateway(stub.url, header_timeout=1.0, http_parser=parser)
    with _connect(gateway) as idle:  # connects and says nothing
        assert (_closed_within(idle, 5) or 99) < 3
    with _connect(gateway) as slow:  # keeps sending a header, a byte at a time
        trickle = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 100
        assert (_closed_within(slow, 5, trickle) or 99) < 3


@PARSERS
def test_a_long_answer_is_not_cut_off_by_the_head_timeout(
    stub: Any, start_gateway: Any, client: httpx.Client, parser: str
) -> None:
    stub.mode = "slow"  # 20 s of chunks; the head arrived at once
    gateway = start_gateway(stub.url, header_timeout=0.5, http_parser=parser)
    with client.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}
    ) as response:
        lines = response.iter_lines()
        started = time.monotonic()
        while time.monotonic() - started < 1.5:
            assert next(lines) is not None
    # Keep-alive: the same connection serves the next request after the head timeout.
    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT).status_code == 200


@PARSERS
def test_connections_per_client_are_bounded(
    stub: Any, start_gateway: Any, client: httpx.Client, parser: str
) -> None:
    gateway = start_gateway(
        stub.url, max_connections_per_client=3, header_timeout=30.0, http_parser=parser
    )
    held = [_connect(gateway) for _ in range(3)]
    try:
        time.sleep(0.2)
        with _connect(gateway) as fourth:
            assert (_closed_within(fourth, 3) or 99) < 1
        with pytest.raises(httpx.TransportError):
            httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, timeout=WAIT)
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + WAIT
    while True:  # the server sees the held connections close
        try:
            if client.post(f"{gateway}/v1/chat/completions", json=CHAT).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _head_answer(gateway: str, head: bytes) -> bytes:
    """What the server sends back (until it closes, at most WAIT s) for ``head`` sent at once."""
    with _connect(gateway) as sock:
        with contextlib.suppress(OSError):  # closed while sending: what arrived still counts
            sock.sendall(head)
        got = b""
        sock.settimeout(WAIT)
        try:
            while part := sock.recv(65536):
                got += part
        except (TimeoutError, ConnectionResetError):
            pass
        return got


@PARSERS
def test_a_request_head_over_the_size_limit_is_refused(
    stub: Any, start_gateway: Any, client: httpx.Client, parser: str
) -> None:
    gateway = start_gateway(stub.url, max_head_bytes=4096, http_parser=parser)
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    too_large = request + b"X-Padding: " + b"a" * 8192 + b"\r\n"  # never ends: no blank line
    answer = _head_answer(gateway, too_large)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    # Under the limit, with a body far over it (the body is not the head): answered.
    body = {**CHAT, "padding": "b" * 20_000}
    padded = client.post(
        f"{gateway}/v1/chat/completions", json=body, headers={"x-padding": "a" * 2000}
    )
    assert padded.status_code == 200


def test_a_large_head_in_pieces_is_counted_across_them(stub: Any, start_gateway: Any) -> None:
    gateway = start_gateway(stub.url, max_head_bytes=4096, header_timeout=30.0)
    with _connect(gateway) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Padding: ")
        for _ in range(10):  # 10 pieces of 1 KB, each under the limit, the head over it
            time.sleep(0.05)
            try:
                sock.sendall(b"a" * 1024)
            except OSError:
                break
        sock.settimeout(WAIT)
        answer = b""
        try:
            while part := sock.recv(65536):
                answer += part
        except (TimeoutError, ConnectionResetError):
            pass
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]


def test_x_forwarded_for_from_loopback_does_not_dodge_the_per_address_limit(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    # uvicorn's default believes X-Forwarded-For from 127.0.0.1: a local client could name a
    # new address with every request and never reach its per-address rate limit.
    gateway = start_gateway(stub.url, rate_limit_per_minute=2)
    statuses = [
        client.post(
            f"{gateway}/v1/chat/completions", json=CHAT, headers={"x-forwarded-for": f"10.0.0.{i}"}
        ).status_code
        for i in range(3)
    ]
    assert statuses == [200, 200, 429]


def test_x_forwarded_for_is_believed_from_configured_proxies(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    gateway = start_gateway(stub.url, rate_limit_per_minute=2, forwarded_allow_ips=["127.0.0.1"])
    statuses = [
        client.post(
            f"{gateway}/v1/chat/completions", json=CHAT, headers={"x-forwarded-for": f"10.0.0.{i}"}
        ).status_code
        for i in range(3)
    ]
    assert statuses == [200, 200, 200]  # three clients behind one trusted proxy


@PARSERS
def test_a_whole_head_over_the_size_limit_in_one_read_is_refused(
    stub: Any, start_gateway: Any, parser: str
) -> None:
    """A complete 70 KB head sent in one write (both parsers bound only incomplete heads: this
    one got a 200); a head under the limit with a large body in the same write is answered."""
    gateway = start_gateway(stub.url, http_parser=parser)  # max_head_bytes 64 KiB as shipped
    body = json.dumps(CHAT).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n" % len(body)
    )
    whole = head + b"X-Padding: " + b"a" * 70_000 + b"\r\n\r\n" + body
    answer = _head_answer(gateway, whole)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    padded = json.dumps({**CHAT, "padding": "b" * 100_000}).encode()
    small = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(padded)
    )
    assert _head_answer(gateway, small + padded).startswith(b"HTTP/1.1 200")
