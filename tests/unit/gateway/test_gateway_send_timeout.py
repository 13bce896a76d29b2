"""A client that stops reading its answer does not hold its slot (gateway/server.py,
``send_timeout``): once the connection's write buffer stays full that long, the connection is
aborted and the request's in-flight slot freed — with both HTTP parsers."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest

WAIT = 10.0
PARSERS = pytest.mark.parametrize("parser", ["httptools", "h11"])


def _never_reading_stream(gateway: str) -> socket.socket:
    """A raw connection that asks for a chat stream and never reads a byte of it (a small
    receive buffer, so the gateway's side fills quickly)."""
    host, port = gateway.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(WAIT)
    sock.connect((host, int(port)))
    body = json.dumps(
        {"messages": [{"role": "user", "content": "Write a lot."}], "stream": True}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


def _status(client: httpx.Client, gateway: str) -> int:
    chat = {"messages": [{"role": "user", "content": "Capital of France?"}]}
    return client.post(f"{gateway}/v1/chat/completions", json=chat).status_code


@PARSERS
def test_a_client_that_stops_reading_loses_its_slot_after_send_timeout(
    stub: Any, start_gateway: Any, client: httpx.Client, parser: str
) -> None:
    stub.stream_texts = ["x" * 8000] * 4000  # ~32 MB: far more than the socket buffers hold
    gateway = start_gateway(stub.url, max_in_flight=1, send_timeout=1.0, http_parser=parser)
    sock = _never_reading_stream(gateway)
    try:
        assert stub.stream_started.wait(WAIT)
        assert _status(client, gateway) == 503  # the one slot is held by the stalled stream
        started = time.monotonic()
        while _status(client, gateway) != 200:
            assert time.monotonic() - started < 1.0 + WAIT, "the stalled stream kept its slot"
            time.sleep(0.1)
    finally:
        sock.close()
    metrics = client.get(f"{gateway}/metrics").text
    assert "gateway_slow_clients_aborted_total 1.0" in metrics


def test_a_slow_but_reading_client_is_not_cut_off(
    stub: Any, start_gateway: Any, client: httpx.Client
) -> None:
    stub.stream_texts = ["x" * 8000] * 200  # ~1.6 MB, read in pieces with pauses
    gateway = start_gateway(stub.url, send_timeout=1.0)
    sock = _never_reading_stream(gateway)
    got = b""
    with sock:
        while not got.endswith(b"\r\n0\r\n\r\n"):  # the chunked answer's last chunk
            part = sock.recv(65536)
            assert part, "the gateway closed a connection whose client was reading"
            got += part
            time.sleep(0.002)
    assert got.startswith(b"HTTP/1.1 200")
    assert b"data: [DONE]" in got
