"""The gateway's uvicorn settings: the limits that hold before the app sees a request.

``server_options(config)`` is every ``uvicorn.Config`` setting the gateway depends on, for
``serve`` (``python -m gateway``) and for ``up`` (model_optimizer/stack.py) alike:

- ``http``: uvicorn's httptools (llhttp) protocol, or its h11 one (``http_parser``), with limits
  uvicorn lacks (``ConnectionLimits``): a request's head (request line and headers) must arrive
  within ``header_timeout`` seconds of the connection opening or of the previous answer ending,
  else the connection is closed (uvicorn waits for a head forever, and its keep-alive timer
  restarts with every byte); a head may take at most ``max_head_bytes`` (h11 bounds an
  incomplete one itself; on httptools, which buffers a head of any size, the protocol counts;
  a whole head arriving in one read is measured on both); and one client address
  may hold at most ``max_connections_per_client`` connections (the next one is closed at once).
  Trusted proxies (``forwarded_allow_ips``) carry many clients and are not bounded per address.
  An answer must make progress: once the connection's write buffer is past its high-water mark
  (the client stopped reading; uvicorn pauses the app's ``send``), the client has
  ``send_timeout`` seconds to read it back under the low-water mark, else the connection is
  aborted and the request's slot freed (NGINX's ``send_timeout``, between two successive
  writes; counted in ``gateway_slow_clients_aborted_total``, logged at info).
  Bodies are timed by the app (``body_timeout``, gateway/request/completions/proxy.py).
- ``loop``: uvloop (libuv) or asyncio's own event loop (``event_loop``).
- ``access_log``: off unless configured (gateway/request_log.py logs a sample instead).
- ``limit_concurrency``: ``max_connections``; past it uvicorn answers 503 at once.
- ``timeout_keep_alive``: ``keep_alive_timeout``; an idle kept-alive connection is closed then.
- ``proxy_headers`` / ``forwarded_allow_ips``: X-Forwarded-For and X-Forwarded-Proto are believed
  only from the configured proxies; none by default (uvicorn's default believes 127.0.0.1, which
  let a local client pick its own address and dodge per-address limits).
- ``server_header``: off (no ``server: uvicorn`` on answers).
- ``timeout_graceful_shutdown``: on SIGTERM uvicorn stops accepting and lets requests finish;
  streams still open after ``shutdown_timeout`` end with an error event (503
  ``shutting_down``) and ``[DONE]`` (gateway/serving.py, Envoy's drain and NGINX's
  ``worker_shutdown_timeout``); ``SHUTDOWN_FLUSH`` seconds later uvicorn cancels what is
  left, and the process exits. The orchestrator's grace period must exceed both (compose's
  ``stop_grace_period`` and the Deployment's ``terminationGracePeriodSeconds`` are 30 s).
"""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import logging
import re
import time
from collections.abc import Sequence
from typing import Any

import h11
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config import GatewayConfig
from gateway.serving import serving_state

logger = logging.getLogger(__name__)
_LOG_EVERY = 60.0  # seconds between two log lines about refused connections
# Seconds past shutdown_timeout before uvicorn cancels what is left: the drained streams'
# error events are written meanwhile (gateway/request/stream/relay.py gives them 1 s).
SHUTDOWN_FLUSH = 2.0


def server_options(config: GatewayConfig) -> dict[str, Any]:
    """The ``uvicorn.Config`` keywords of a gateway served with ``config``."""
    proxies = list(config.forwarded_allow_ips)
    return {
        "http": protocol_class(
            config.header_timeout,
            config.max_connections_per_client,
            Trusted(proxies),
            parser=config.http_parser,
            max_head_bytes=config.max_head_bytes,
            send_timeout=config.send_timeout,
            shutdown_timeout=config.shutdown_timeout,
        ),
        "timeout_graceful_shutdown": config.shutdown_timeout + SHUTDOWN_FLUSH,
        "h11_max_incomplete_event_size": config.max_head_bytes,
        "loop": config.event_loop,
        "access_log": config.access_log,
        "limit_concurrency": config.max_connections,
        "timeout_keep_alive": config.keep_alive_timeout,
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": proxies or None,
        "server_header": False,
    }


def log_config(level: str = "INFO") -> dict[str, Any]:
    """uvicorn's logging configuration plus the gateway's own loggers (``gateway.*``: tier
    changes, background loops, the request log) on stderr at ``level``; for a served gateway
    (``serve``, ``up``), never applied by building an app."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["gateway"] = {"handlers": ["default"], "level": level, "propagate": False}
    return config


class Trusted:
    """Addresses in ``forwarded_allow_ips``: IPs, networks (``10.0.0.0/8``) or ``*``."""

    def __init__(self, entries: Sequence[str]) -> None:
        self.any = "*" in entries
        self.networks = [ipaddress.ip_network(e, strict=False) for e in entries if e != "*"]

    def __contains__(self, host: str) -> bool:
        if self.any:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)


class ConnectionLimits:
    """What the gateway adds to uvicorn's HTTP protocols (see the module docstring): a time
    limit on request heads and a bound on connections per client address. Mixed in before
    ``H11Protocol`` or ``HttpToolsProtocol``; ``protocol_class`` sets the limits."""

    header_timeout: float = 10.0
    per_client: int | None = None
    trusted: Trusted = Trusted([])
    max_head_bytes: int = 65_536
    send_timeout: float = 60.0
    shutdown_timeout: float = 20.0
    _refused_logged_at = 0.0

    _head_timer: asyncio.TimerHandle | None = None
    _send_timer: asyncio.TimerHandle | None = None
    # uvicorn's protocol state, as both protocols name it
    client: tuple[str, int] | None
    connections: set[Any]
    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        host = self.client[0] if self.client else None
        if self.per_client is not None and host is not None and host not in self.trusted:
            held = sum(
                1
                for c in self.connections
                if isinstance(c, ConnectionLimits) and c.client and c.client[0] == host
            )
            if held > self.per_client:
                self._log_refusal(host)
                transport.close()
                return
        self._arm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if not self.transport.is_closing():
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().connection_lost(exc)  # type: ignore[misc]

    def shutdown(self) -> None:
        """uvicorn is shutting down (SIGTERM): streams still open after ``shutdown_timeout``
        will be ended (gateway/serving.py)."""
        serving_state(self.loop).begin_drain(self.shutdown_timeout)
        super().shutdown()  # type: ignore[misc]

    def pause_writing(self) -> None:
        """The write buffer passed its high-water mark: the client must read within
        ``send_timeout`` seconds."""
        super().pause_writing()  # type: ignore[misc]
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.send_timeout, self._send_stalled)

    def resume_writing(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().resume_writing()  # type: ignore[misc]

    def _send_stalled(self) -> None:
        """The client read nothing back for ``send_timeout`` s: abort the connection, which
        ends the request (its disconnect) and frees its slot."""
        self._send_timer = None
        if self.transport.is_closing():
            return
        serving_state(self.loop).slow_clients_aborted += 1
        host = self.client[0] if self.client else "?"
        logger.info(
            "client %s read nothing of its answer for %.0f s (send_timeout): connection aborted",
            host,
            self.send_timeout,
        )
        self.transport.abort()

    def _arm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_late, self.cycle)

    def _head_late(self, cycle_then: object) -> None:
        """No request head completed since the timer was armed: close the connection."""
        self._head_timer = None
        if self.cycle is cycle_then and not self.transport.is_closing():
            self.transport.close()

    def _log_refusal(self, host: str) -> None:
        now = time.monotonic()
        if now - ConnectionLimits._refused_logged_at >= _LOG_EVERY:
            ConnectionLimits._refused_logged_at = now
            logger.warning(
                "client %s holds %d connections: further ones are closed (logged once a minute)",
                host,
                self.per_client,
            )

    def _head_over_limit(self, data: bytes, before: int) -> bool:
        """Whether a head ending in ``data`` (``before`` of its bytes came earlier) is larger
        than ``max_head_bytes``; only asked once the bytes counted pass the limit (both parsers
        bound only an incomplete head: a whole one in one read got through)."""
        end = _HEAD_END.search(data)
        return end is not None and before + end.end() > self.max_head_bytes

    def _refuse_head(self) -> None:
        """400 and close, nothing of the request parsed (both parsers alike)."""
        if not self.transport.is_closing():
            self.transport.write(_HEAD_TOO_LARGE)
            self.transport.close()


_HEAD_END = re.compile(rb"\n\r?\n")  # a head's blank line (llhttp and h11 take bare LFs too)
_HEAD_TOO_LARGE = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: 23\r\n\r\nRequest head too large."
)


class GatewayProtocol(ConnectionLimits, H11Protocol):
    """uvicorn's h11 protocol with the gateway's limits: h11 bounds an incomplete head
    (``h11_max_incomplete_event_size``), the bytes of a head that arrives whole are counted
    here."""

    _head_bytes = 0  # bytes received while h11 awaited a request head

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            before = self._head_bytes
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes and self._head_over_limit(data, before):
                self._refuse_head()
                return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._head_bytes = 0  # the head is in: the next one counts from its first byte


class GatewayHttpToolsProtocol(ConnectionLimits, HttpToolsProtocol):
    """uvicorn's httptools protocol with the gateway's limits, and a bound on a head's size:
    llhttp buffers a header of any length, so the bytes received while a head is incomplete
    are counted, and past ``max_head_bytes`` the client gets a 400 and the connection closes,
    whether the head is still incomplete or arrived whole in one read."""

    _awaiting_head = True  # no head yet since the connection opened or the last body ended
    _head_bytes = 0

    def data_received(self, data: bytes) -> None:
        if self._awaiting_head:
            before = self._head_bytes
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes and self._head_over_limit(data, before):
                self._refuse_head()
                return
        super().data_received(data)  # the head's end, if in ``data``, clears _awaiting_head
        too_large = self._awaiting_head and self._head_bytes > self.max_head_bytes
        if too_large and not self.transport.is_closing():
            self.send_400_response("Request head too large.")

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._awaiting_head, self._head_bytes = True, 0  # a pipelined request's head may follow
        super().on_message_complete()


def protocol_class(
    header_timeout: float,
    per_client: int | None,
    trusted: Trusted,
    *,
    parser: str = "httptools",
    max_head_bytes: int = 65_536,
    send_timeout: float = 60.0,
    shutdown_timeout: float = 20.0,
) -> type[ConnectionLimits]:
    """The ``parser``'s protocol with these limits (uvicorn builds one instance per
    connection)."""
    base: type[ConnectionLimits] = (
        GatewayHttpToolsProtocol if parser == "httptools" else GatewayProtocol
    )
    return type(
        base.__name__,
        (base,),
        {
            "header_timeout": header_timeout,
            "per_client": per_client,
            "trusted": trusted,
            "max_head_bytes": max_head_bytes,
            "send_timeout": send_timeout,
            "shutdown_timeout": shutdown_timeout,
        },
    )
