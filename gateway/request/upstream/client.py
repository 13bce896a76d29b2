"""The transport seam: streamed requests to one tier, httpx errors translated in one place."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any, NamedTuple

import anyio
import httpx

from gateway.config import TierEndpoint
from gateway.errors import SERVER_ERROR, APIError
from gateway.request.upstream.aiohttp_transport import AiohttpBody, AiohttpTransport

logger = logging.getLogger(__name__)

# Request headers that may travel from the client to a tier; everything else (notably
# Authorization, cookies, hop-by-hop headers and Accept-Encoding) stays behind, and so does
# X-Request-Id: vLLM takes it as the engine's request id (_base_request_id), which
# one client must not choose for another's requests to collide with.
FORWARDED_HEADERS = frozenset({"content-type", "accept", "traceparent", "tracestate"})


class UpstreamUnavailable(APIError):
    """The tier could not be reached; nothing was sent, so another tier may be tried."""

    retryable = True

    def __init__(self, tier: str, reason: str) -> None:
        super().__init__(
            503,
            f"tier '{tier}' is unreachable: {reason}",
            SERVER_ERROR,
            code="upstream_unavailable",
            public="the model server is unreachable",
        )
        self.tier = tier


class UpstreamLost(UpstreamUnavailable):
    """The tier took the request and went away before its answer began (a SIGKILLed server
    resets the connection): the client has nothing yet, so another endpoint or tier may
    answer it whole."""

    def __init__(self, tier: str, reason: str) -> None:
        super().__init__(tier, reason)
        self.message = f"tier '{tier}' went away before answering: {reason}"


class UpstreamTimeout(APIError):
    """The tier accepted the request but did not answer in time."""

    retryable = False

    def __init__(self, tier: str, reason: str) -> None:
        super().__init__(
            504,
            f"tier '{tier}' timed out: {reason}",
            SERVER_ERROR,
            code="upstream_timeout",
            public="the model server timed out",
        )
        self.tier = tier


class UpstreamFailed(APIError):
    """The tier broke the exchange (protocol error, connection reset, ...)."""

    retryable = False

    def __init__(self, tier: str, reason: str) -> None:
        super().__init__(
            502,
            f"tier '{tier}' failed: {reason}",
            SERVER_ERROR,
            code="upstream_error",
            public="the model server failed",
        )
        self.tier = tier


def event_too_large(tier: TierEndpoint, limit: int) -> UpstreamFailed:
    """The failure of a tier that sent one SSE event larger than ``limit`` bytes (unended)."""
    return UpstreamFailed(tier.name, f"it sent an SSE event larger than max_answer_bytes ({limit})")


class UpstreamTooLarge(UpstreamFailed):
    """The tier's answer is larger than the gateway holds of one answer (``max_answer_bytes``):
    a tier failure, its answer never buffered whole."""

    def __init__(self, tier: str, limit: int) -> None:
        super().__init__(tier, f"its answer is larger than max_answer_bytes ({limit} bytes)")
        self.code = "answer_too_large"
        self.public = (
            f"the model server's answer is larger than the gateway's limit ({limit} bytes)"
        )


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The subset of client headers a tier may see, plus ``accept-encoding: identity``. A value
    that is not ASCII stays behind too: none of these carries one legitimately, and the
    transports would send it differently (httpx refuses it, aiohttp re-encodes it)."""
    kept = {
        key.lower(): value
        for key, value in headers.items()
        if key.lower() in FORWARDED_HEADERS and value.isascii()
    }
    # Raw bytes are relayed as they come, so ask the tier not to compress them.
    kept["accept-encoding"] = "identity"
    return kept


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def translate_error(exc: httpx.HTTPError, tier: TierEndpoint, *, quiet: bool = False) -> APIError:
    """Map an httpx exception raised while talking to ``tier`` onto a gateway error.

    Logged as a warning unless ``quiet`` (the tier scraper, which logs state changes instead of
    one line per failed probe).
    """
    reason = _reason(exc)
    if not quiet:
        logger.warning("tier %s at %s: %s", tier.name, tier.base_url, reason)
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return UpstreamUnavailable(tier.name, reason)
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(tier.name, reason)
    return UpstreamFailed(tier.name, reason)


async def aclose_quietly(response: httpx.Response) -> None:
    """Close a streamed response even while the caller is being cancelled."""
    if response.is_closed:  # read to its end: httpx closed it then
        return
    if isinstance(response.stream, AiohttpBody):
        # Closing is handing the connection back to aiohttp's pool (or dropping it), with no
        # await inside: nothing for a cancellation to interrupt, so no shield to pay for.
        response.is_closed = True
        await response.stream.aclose()
        return
    with anyio.CancelScope(shield=True):
        try:
            await response.aclose()
        except httpx.HTTPError as exc:  # closing a broken connection may itself fail
            logger.debug("closing upstream response failed: %s", _reason(exc))


@functools.lru_cache(maxsize=1024)
def _url(base_url: str, path: str) -> httpx.URL:
    """A tier's URL, parsed once (pool endpoints and paths are few)."""
    return httpx.URL(base_url + path)


@functools.lru_cache(maxsize=1024)
def _target(base_url: str, path: str) -> tuple[str, str]:
    """A tier's URL as aiohttp takes it, and the Host header httpx would send for it."""
    url = _url(base_url, path)
    return str(url), url.netloc.decode("ascii")


def json_bytes(body: Any) -> bytes:
    """A JSON request body encoded as httpx encodes ``json=`` (compact, UTF-8, no NaN)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class Upstream:
    """Sends to the tiers through the shared client's transport.

    ``client`` (the gateway's one ``httpx.AsyncClient``) keeps the timeouts and serves code
    that wants a whole client (gateway/control/resets.py). A completion request goes to
    ``transport`` directly when one is given — the client's own: httpx's layers between the
    two (redirects, auth, a cookie jar filled from every answer, the URL parsed again each
    time) cost a tenth of the gateway's CPU per request and do nothing here. With the aiohttp
    transport it goes further: no httpx request is built (the headers httpx would write are
    written directly; the request is built only for an error to name), and a whole answer is
    read at once instead of a chunk at a time.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        transport: httpx.AsyncBaseTransport | None = None,
        max_answer_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.client, self.transport = client, transport
        # What is held of one answer at once: a whole answer read, one SSE event (config).
        self.max_answer_bytes = max_answer_bytes

    async def send(
        self,
        tier: TierEndpoint,
        method: str,
        path: str,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        *,
        quiet: bool = False,
    ) -> httpx.Response:
        """Open a streamed request; the caller must close the response (``aclose_quietly``).
        The tier's own key, if it has one, is its bearer token (never the client's)."""
        sent = forward_headers(headers or {})
        if tier.api_key:
            sent["authorization"] = f"Bearer {tier.api_key}"
        try:
            return await self._send(tier, method, path, json_body, sent, timeout)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            # Before the response's head (send returns once it is read): nothing reached the
            # client, so the request may be tried again elsewhere.
            error = translate_error(exc, tier, quiet=quiet)
            raise UpstreamLost(tier.name, _reason(exc)) from error
        except httpx.HTTPError as exc:
            raise translate_error(exc, tier, quiet=quiet) from exc

    async def _send(
        self,
        tier: TierEndpoint,
        method: str,
        path: str,
        json_body: Any,
        headers: dict[str, str],
        timeout: float | None,
    ) -> httpx.Response:
        limits = httpx.Timeout(timeout) if timeout is not None else self.client.timeout
        if isinstance(self.transport, AiohttpTransport):
            return await self._open(self.transport, tier, method, path, json_body, headers, limits)
        if self.transport is None:
            request = self.client.build_request(
                method, tier.base_url + path, json=json_body, headers=headers, timeout=limits
            )
            return await self.client.send(request, stream=True)
        request = httpx.Request(
            method,
            _url(tier.base_url, path),
            headers=headers,
            json=json_body,
            extensions={"timeout": limits.as_dict()},
        )
        response = await self.transport.handle_async_request(request)
        response.request = request
        return response

    async def _open(
        self,
        transport: AiohttpTransport,
        tier: TierEndpoint,
        method: str,
        path: str,
        json_body: Any,
        headers: dict[str, str],
        limits: httpx.Timeout,
    ) -> httpx.Response:
        """Straight to aiohttp, with the headers httpx would have built (Host, Content-Length,
        a default Content-Type for a JSON body) and no httpx request unless one is needed."""
        url, host = _target(tier.base_url, path)
        body = b"" if json_body is None else json_bytes(json_body)
        sent = [("Host", host), *headers.items()]
        if json_body is not None:
            sent.append(("Content-Length", str(len(body))))
            if "content-type" not in headers:
                sent.append(("Content-Type", "application/json"))

        def request() -> httpx.Request:
            return httpx.Request(method, url, headers=sent, content=body)

        # The answer carries no request (``response.request`` is unset): nothing here reads it.
        return await transport.open(method, url, sent, body, limits.connect, limits.read, request)

    async def iter_raw(
        self, tier: TierEndpoint, response: httpx.Response
    ) -> AsyncGenerator[bytes, None]:
        """The response body as it arrives, undecoded; httpx errors become ``APIError``."""
        # aiohttp's body is read straight (httpx's aiter_raw adds a generator and a chunker
        # per chunk); the caller closes the response either way.
        chunks = (
            response.stream if isinstance(response.stream, AiohttpBody) else response.aiter_raw()
        )
        try:
            async for chunk in chunks:
                yield chunk
        except httpx.HTTPError as exc:
            raise translate_error(exc, tier) from exc

    async def read(
        self, tier: TierEndpoint, response: httpx.Response, limit: int | None = None
    ) -> bytes:
        """The whole response body, then the response is closed. Past ``limit`` bytes (its
        Content-Length or what arrived; default ``max_answer_bytes``) ``UpstreamTooLarge``:
        nothing more is read."""
        limit = self.max_answer_bytes if limit is None else limit
        try:
            length = response.headers.get("content-length", "")
            known = int(length) if length.isdigit() else None
            if limit is not None and known is not None and known > limit:
                raise UpstreamTooLarge(tier.name, limit)
            if isinstance(response.stream, AiohttpBody) and (limit is None or known is not None):
                try:  # at once, not a chunk at a time
                    return await response.stream.read()
                except httpx.HTTPError as exc:
                    raise translate_error(exc, tier) from exc
            body = bytearray()
            async for chunk in self.iter_raw(tier, response):
                body += chunk
                if limit is not None and len(body) > limit:
                    raise UpstreamTooLarge(tier.name, limit)
            return bytes(body)
        finally:
            await aclose_quietly(response)


class Opened(NamedTuple):
    """A request opened on a tier's endpoint (gateway/request/route/chain.py ``open_chain``): the
    upstream that reads it, the endpoint that answered and its response, which travel
    together to whatever relays or reads the answer."""

    upstream: Upstream
    tier: TierEndpoint
    response: httpx.Response
