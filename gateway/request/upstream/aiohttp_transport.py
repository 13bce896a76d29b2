"""An httpx transport over aiohttp's client: the gateway keeps httpx's API
(gateway/request/upstream/client.py) and sends through aiohttp's connection pool and C HTTP parser,
which cost about a third less CPU per proxied request than httpcore on this machine
(docs/benchmarks.md).

Why not PyPI's ``httpx-aiohttp``: its exception map turns every aiohttp connection error into
``httpx.ConnectTimeout`` (a server that dropped the connection mid-answer included), and the
gateway decides from the exception's type whether a request may be sent again elsewhere. Here
each aiohttp error becomes the httpx error httpcore raises for the same event:

- cannot connect (refused, unreachable, no such name) → ``ConnectError``; connect timed out →
  ``ConnectTimeout``
- the server closed before or during the answer's head → ``RemoteProtocolError``; reset →
  ``ReadError``
- no byte within the read timeout → ``ReadTimeout``
- the body cut short (a chunked stream that never ended) → ``RemoteProtocolError``; reset
  mid-body → ``ReadError``
- a malformed answer → ``RemoteProtocolError``

Bodies are relayed as they arrive, undecoded (``auto_decompress`` off), and a body that ends
in an error first hands on every byte that arrived before it (aiohttp's reader raises the
error first; the transport drains its buffer). Timeouts come from each
request's httpx timeout (connect and read; aiohttp has no separate write or pool timeout).
The gateway's seam (gateway/request/upstream/client.py) calls ``open`` directly, with the headers
httpx would have written, so that no httpx request is built unless an error needs one.
The aiohttp session is opened on first use, in the running event loop, and closed by
``aclose`` (httpx's client closes its transport).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager

import aiohttp
import httpx

CHUNK = 64 * 1024
RequestSource = httpx.Request | Callable[[], httpx.Request]
# Headers aiohttp would otherwise add on its own: the request carries exactly what it is given.
SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


@contextmanager
def httpx_errors(request: RequestSource) -> Iterator[None]:
    """Raise aiohttp's client errors as the httpx errors httpcore raises for the same event.
    ``request``: the httpx request, or what builds it (only an error needs one)."""
    try:
        yield
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise httpx_error(exc, _built(request)) from exc


def httpx_error(exc: aiohttp.ClientError | TimeoutError, request: httpx.Request) -> httpx.HTTPError:
    """The httpx error httpcore raises for the event behind aiohttp's ``exc``."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(str(exc) or "connect timed out", request=request)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(str(exc), request=request)
    if isinstance(exc, aiohttp.SocketTimeoutError | aiohttp.ServerTimeoutError):
        return httpx.ReadTimeout(str(exc) or "read timed out", request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        message = "Server disconnected without sending a response."
        return httpx.RemoteProtocolError(message, request=request)
    if isinstance(exc, aiohttp.ClientPayloadError):
        if _reset(exc):
            return httpx.ReadError(str(exc), request=request)
        message = f"peer closed connection without sending complete message body ({exc})"
        return httpx.RemoteProtocolError(message, request=request)
    if isinstance(exc, aiohttp.ClientOSError):
        return httpx.ReadError(str(exc), request=request)
    if isinstance(exc, aiohttp.ClientResponseError):
        return httpx.RemoteProtocolError(str(exc), request=request)
    if isinstance(exc, aiohttp.ClientError):
        return httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request)
    return httpx.ReadTimeout("timed out", request=request)  # asyncio's own, unwrapped


def _built(request: RequestSource) -> httpx.Request:
    return request if isinstance(request, httpx.Request) else request()


def _reset(exc: BaseException) -> bool:
    """Whether a connection reset lies under ``exc`` (aiohttp names the one that cut a body
    short only in its message)."""
    if "ConnectionResetError" in str(exc):
        return True
    seen: BaseException | None = exc
    for _ in range(8):
        seen = seen.__cause__ or seen.__context__ if seen is not None else None
        if seen is None:
            return False
        if isinstance(seen, OSError):
            return True
    return False


class AiohttpBody(httpx.AsyncByteStream):
    """An aiohttp response's body as httpx reads a streamed one."""

    def __init__(self, response: aiohttp.ClientResponse, request: RequestSource) -> None:
        self._response, self._request = response, request

    async def read(self) -> bytes:
        """The whole body at once (what iterating would yield, joined)."""
        with httpx_errors(self._request):
            return await self._response.read()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        with httpx_errors(self._request):
            try:
                async for chunk in content.iter_any():
                    yield chunk
            except aiohttp.ClientError:
                # aiohttp raises a stream's error before the bytes that arrived ahead of it
                # (StreamReader.readany checks the error first): hand those on, then the error.
                # _read_nowait is the buffer's own drain (aiohttp 3.14, pinned); the
                # "dies mid-stream" tests fail without it.
                left = content._read_nowait(-1) if content._buffer else b""
                if left:
                    yield left
                raise

    async def aclose(self) -> None:
        self._response.release()  # back to the pool if read whole; closed if not


class AiohttpTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over aiohttp (see the module docstring). ``keepalive`` seconds an idle
    connection is kept; no cap on connections (admission control is the router's)."""

    def __init__(self, keepalive: float = 5.0) -> None:
        self._keepalive = keepalive
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self._keepalive)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, trust_env=False
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        timeouts = request.extensions.get("timeout", {})
        return await self.open(
            request.method,
            str(request.url),
            headers,
            body,
            timeouts.get("connect"),
            timeouts.get("read"),
            request,
        )

    async def open(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes,
        connect: float | None,
        read: float | None,
        request: RequestSource,
    ) -> httpx.Response:
        """Send ``method url`` with exactly ``headers`` and ``body``; the answer once its head
        has arrived, its body streamed. ``request``: the httpx request errors name (or what
        builds it: the gateway's seam sends without building one unless something fails)."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)
        with httpx_errors(request):
            response = await self._open().request(
                method,
                url,
                data=body or None,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
                skip_auto_headers=SKIP_AUTO_HEADERS,
                read_bufsize=CHUNK,
            )
        return httpx.Response(
            response.status,
            headers=response.raw_headers,
            stream=AiohttpBody(response, request),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
            await asyncio.sleep(0)  # let aiohttp's connection close callbacks run
