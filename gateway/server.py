"""The gateway's uvicorn settings: the limits that hold before the app sees a request.

``server_options(config)`` is every ``uvicorn.Config`` setting the gateway depends on, for
``serve`` (``python -m gateway``) and for ``up`` (model_optimizer/stack.py) alike:

- ``http``: ``GatewayProtocol``, uvicorn's h11 protocol with two limits uvicorn lacks:
  a request's head (request line and headers) must arrive within ``header_timeout`` seconds of
  the connection opening or of the previous answer ending, else the connection is closed
  (uvicorn waits for a head forever, and its keep-alive timer restarts with every byte); and
  one client address may hold at most ``max_connections_per_client`` connections (the next one
  is closed at once). Trusted proxies (``forwarded_allow_ips``) carry many clients and are not
  bounded per address. Bodies are timed by the app (``body_timeout``, gateway/request/proxy.py).
- ``limit_concurrency``: ``max_connections``; past it uvicorn answers 503 at once.
- ``timeout_keep_alive``: ``keep_alive_timeout``; an idle kept-alive connection is closed then.
- ``proxy_headers`` / ``forwarded_allow_ips``: X-Forwarded-For and X-Forwarded-Proto are believed
  only from the configured proxies; none by default (uvicorn's default believes 127.0.0.1, which
  let a local client pick its own address and dodge per-address limits).
- ``server_header``: off (no ``server: uvicorn`` on answers).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Sequence
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.config import GatewayConfig

logger = logging.getLogger(__name__)
_LOG_EVERY = 60.0  # seconds between two log lines about refused connections


def server_options(config: GatewayConfig) -> dict[str, Any]:
    """The ``uvicorn.Config`` keywords of a gateway served with ``config``."""
    proxies = list(config.forwarded_allow_ips)
    return {
        "http": protocol_class(
            config.header_timeout, config.max_connections_per_client, Trusted(proxies)
        ),
        "limit_concurrency": config.max_connections,
        "timeout_keep_alive": config.keep_alive_timeout,
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": proxies or None,
        "server_header": False,
    }


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


class GatewayProtocol(H11Protocol):
    """uvicorn's h11 protocol with a time limit on request heads and a bound on connections
    per client address (see the module docstring); ``protocol_class`` sets the limits."""

    header_timeout: float = 10.0
    per_client: int | None = None
    trusted: Trusted = Trusted([])
    _refused_logged_at = 0.0

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        host = self.client[0] if self.client else None
        if self.per_client is not None and host is not None and host not in self.trusted:
            held = sum(
                1
                for c in self.connections
                if isinstance(c, H11Protocol) and c.client and c.client[0] == host
            )
            if held > self.per_client:
                self._log_refusal(host)
                transport.close()
                return
        self._arm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

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
        if now - GatewayProtocol._refused_logged_at >= _LOG_EVERY:
            GatewayProtocol._refused_logged_at = now
            logger.warning(
                "client %s holds %d connections: further ones are closed (logged once a minute)",
                host,
                self.per_client,
            )


def protocol_class(
    header_timeout: float, per_client: int | None, trusted: Trusted
) -> type[GatewayProtocol]:
    """A ``GatewayProtocol`` with these limits (uvicorn builds one instance per connection)."""
    return type(
        "GatewayProtocol",
        (GatewayProtocol,),
        {"header_timeout": header_timeout, "per_client": per_client, "trusted": trusted},
    )
