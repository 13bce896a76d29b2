"""The aiohttp transport (gateway/request/upstream/aiohttp_transport.py) against httpx's own, on the
same misbehaving servers on 127.0.0.1: every fault must become the same gateway error at the
transport seam (gateway/request/upstream/client.py: its class decides whether the request may go
elsewhere), after the same bytes; a good answer must arrive byte for byte; the request must
leave as httpx built it."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from gateway.config import TierEndpoint
from gateway.errors import APIError
from gateway.request.upstream.aiohttp_transport import AiohttpTransport
from gateway.request.upstream.client import Upstream, aclose_quietly

TRANSPORTS = ["aiohttp", "httpx"]
HEAD_CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
EVENT = b"data: {}\n\n"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            return
        data += part


def _reset(conn: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a SIGKILLed server's kernel does."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


BEHAVIOURS: dict[str, Callable[[socket.socket], None]] = {
    "closes before answering": lambda c: (_read_request(c), c.close()),
    "resets before answering": lambda c: (_read_request(c), _reset(c)),
    "never answers": lambda c: (_read_request(c), threading.Event().wait(3), c.close()),
    "cuts the stream": lambda c: (
        _read_request(c),
        c.sendall(HEAD_CHUNKED + _chunk(EVENT)),
        c.close(),
    ),
    "resets mid-stream": lambda c: (
        _read_request(c),
        c.sendall(HEAD_CHUNKED + _chunk(EVENT)),
        threading.Event().wait(0.2),
        _reset(c),
    ),
    "sends two events and dies": lambda c: (
        _read_request(c),
        c.sendall(HEAD_CHUNKED + _chunk(EVENT) + _chunk(EVENT) + b"5\r\nda"),
        c.close(),
    ),
    "sends garbage": lambda c: (_read_request(c), c.sendall(b"NOT HTTP AT ALL\r\n\r\n"), c.close()),
    "streams": lambda c: (
        _read_request(c),
        c.sendall(HEAD_CHUNKED + _chunk(EVENT) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"),
        c.close(),
    ),
}


# What the gateway makes of each (both transports): before the head another endpoint or tier
# may take the request (UpstreamLost); a silent tier times out; a body cut short is a failure.
EXPECTED = {
    "closes before answering": "UpstreamLost before the head",
    "resets before answering": "UpstreamLost before the head",
    "never answers": "UpstreamTimeout before the head",
    "cuts the stream": "UpstreamFailed in the body",
    "resets mid-stream": "UpstreamFailed in the body",
    "sends garbage": "UpstreamLost before the head",
    "sends two events and dies": "UpstreamFailed in the body",
    "streams": "ok",
}


@pytest.fixture
def serve() -> Iterator[Callable[[str], str]]:
    """A one-connection-at-a-time TCP server on 127.0.0.1 doing one of BEHAVIOURS."""
    listeners: list[socket.socket] = []

    def start(behaviour: str) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sock.settimeout(10)
        listeners.append(sock)

        def loop() -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                threading.Thread(target=BEHAVIOURS[behaviour], args=(conn,), daemon=True).start()

        threading.Thread(target=loop, daemon=True).start()
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for sock in listeners:
        sock.close()


def _client(kind: str) -> httpx.AsyncClient:
    timeout = httpx.Timeout(1.0, connect=1.0)
    if kind == "aiohttp":
        return httpx.AsyncClient(timeout=timeout, transport=AiohttpTransport(), trust_env=False)
    return httpx.AsyncClient(timeout=timeout, trust_env=False)


async def _outcome(
    kind: str, url: str, pause: float = 0.0, *, seam: bool = False, whole: bool = False
) -> tuple[str, bytes]:
    """The gateway error the seam raised (its class, and whether before or during the body),
    or 'ok', and the body bytes that arrived before it (read ``pause`` s after the head).
    ``seam``: sent as the gateway sends (straight to the transport; through the whole client
    otherwise); ``whole``: the body read at once (``Upstream.read``), not relayed in pieces."""
    got = b""
    tier = TierEndpoint(name="t", base_url=url)
    async with _client(kind) as client:
        upstream = Upstream(client, client._transport if seam else None)
        try:
            response = await upstream.send(tier, "POST", "/v1/chat/completions", {"x": 1})
        except APIError as exc:
            return f"{type(exc).__name__} before the head", got
        await asyncio.sleep(pause)
        try:
            if whole:
                got = await upstream.read(tier, response)
            else:
                async for part in upstream.iter_raw(tier, response):
                    got += part
        except APIError as exc:
            return f"{type(exc).__name__} in the body", got
        finally:
            await aclose_quietly(response)
    return "ok", got


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
def test_every_fault_is_the_same_gateway_error_on_both_transports(
    behaviour: str, serve: Callable[[str], str]
) -> None:
    url = serve(behaviour)
    outcomes = {kind: asyncio.run(_outcome(kind, url)) for kind in TRANSPORTS}
    assert outcomes["aiohttp"][0] == outcomes["httpx"][0] == EXPECTED[behaviour], outcomes
    assert outcomes["aiohttp"][1] == outcomes["httpx"][1]  # the same bytes before the fault
    if behaviour == "streams":
        assert outcomes["aiohttp"] == ("ok", EVENT + b"data: [DONE]\n\n")


@pytest.mark.parametrize("whole", [False, True], ids=["relayed", "read whole"])
@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
def test_the_seams_direct_path_raises_what_the_client_path_raises(
    behaviour: str, whole: bool, serve: Callable[[str], str]
) -> None:
    """The gateway's own path (aiohttp without an httpx request, a whole answer read at once)
    ends every fault in the error the whole httpx client gives, after the same bytes."""
    url = serve(behaviour)
    direct = asyncio.run(_outcome("aiohttp", url, seam=True, whole=whole))
    client = asyncio.run(_outcome("httpx", url, whole=whole))
    assert direct[0] == client[0] == EXPECTED[behaviour], (direct, client)
    assert direct[1] == client[1]


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_bytes_that_arrived_before_the_end_are_relayed_before_the_error(
    kind: str, serve: Callable[[str], str]
) -> None:
    """The events and the cut arrive while nobody reads (the relay busy writing to its client,
    here a pause): aiohttp's reader raises the stream's error before handing over what arrived
    ahead of it unless the transport drains its buffer."""
    url = serve("sends two events and dies")
    for _ in range(3):
        got = asyncio.run(_outcome(kind, url, pause=0.2))
        assert got == ("UpstreamFailed in the body", EVENT + EVENT + b"da")  # "da": cut chunk


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_refused_connection_is_unavailable(kind: str) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening: refused
    try:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        assert asyncio.run(_outcome(kind, url)) == ("UpstreamUnavailable before the head", b"")
    finally:
        sock.close()


def _capture(
    kind: str, via_upstream: bool | None = None
) -> tuple[tuple[int, bytes, str | None], list[bytes], bytes]:
    """Send one POST with ``kind``'s transport to a server that records it and answers 3
    gzip-labelled bytes: (status, raw body, content-encoding), the request's header lines
    (lower case, sorted) and its body."""
    seen: list[bytes] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()

    def answer() -> None:
        conn, _ = sock.accept()
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith((b'{"x":1}', b'{"x": 1}')):
            data += conn.recv(65536)
        seen.append(data)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 3\r\n\r\nabc")
        conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    port = str(sock.getsockname()[1]).encode()

    async def send() -> tuple[int, bytes, str | None]:
        async with _client(kind) as client:
            if via_upstream is not None:  # the gateway's seam: straight to the transport or not
                transport = client._transport if via_upstream else None
                upstream = Upstream(client, transport)
                tier = TierEndpoint(name="t", base_url=f"http://127.0.0.1:{port.decode()}")
                got = await upstream.send(tier, "POST", "/v1/x", {"x": 1}, {"accept": "*/*"})
                raw = await upstream.read(tier, got)
                return got.status_code, raw, got.headers.get("content-encoding")
            request = client.build_request(
                "POST",
                f"http://127.0.0.1:{port.decode()}/v1/x",
                content=b'{"x":1}',
                headers={"content-type": "application/json", "accept-encoding": "identity"},
            )
            response = await client.send(request, stream=True)
            raw = b"".join([part async for part in response.aiter_raw()])
            await response.aclose()
            return response.status_code, raw, response.headers.get("content-encoding")

    try:
        answered = asyncio.run(send())
        thread.join(5)
    finally:
        sock.close()
    head, _, body = seen[0].partition(b"\r\n\r\n")
    lines = head.lower().replace(port, b"<port>").split(b"\r\n")
    return answered, [lines[0], *sorted(lines[1:])], body


def test_the_request_arrives_as_httpx_built_it() -> None:
    """Method, path, headers and body as httpx's own transport sends them (nothing aiohttp
    adds on its own), and the answer's bytes relayed raw (not decoded)."""
    ours, theirs = _capture("aiohttp"), _capture("httpx")
    assert ours[0] == (200, b"abc", "gzip")
    assert ours[1][0] == b"post /v1/x http/1.1"
    assert ours[1:] == theirs[1:]


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_the_seam_sends_the_same_request_straight_to_the_transport(kind: str) -> None:
    """Upstream with the transport (the gateway's path) and through the whole client send the
    same request line, body and headers but the client's defaults (user-agent, an explicit
    keep-alive HTTP/1.1 implies), and read the same answer."""
    straight, through_client = _capture(kind, via_upstream=True), _capture(kind, False)
    assert straight[0] == through_client[0] == (200, b"abc", "gzip")
    assert straight[2] == through_client[2]
    assert straight[1][0] == through_client[1][0] == b"post /v1/x http/1.1"
    extra = set(through_client[1]) - set(straight[1])
    assert {line.split(b":")[0] for line in extra} == {b"connection", b"user-agent"}
    assert set(straight[1]) <= set(through_client[1])
    assert {line.split(b":")[0] for line in straight[1][1:]} == {
        b"accept",
        b"accept-encoding",
        b"content-length",
        b"content-type",
        b"host",
    }
