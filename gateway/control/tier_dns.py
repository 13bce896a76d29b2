"""Pools named by DNS: a ``dns`` tier's endpoints are the addresses its name resolves to.

A tier configured with ``dns: host:port`` (gateway/config.py; e.g. a Kubernetes headless
Service, whose name resolves to the address of every ready pod) has one endpoint per address,
``scheme://address:port``. ``resolve_pools`` resolves every such tier once and hands the
addresses to the board (``TierBoard.set_pool``: endpoints come and go without a restart, the
ones that left take their scrapes along); the app runs ``resolve_forever`` every
``dns_interval`` seconds, kept running through any exception (gateway/app.py
``keep_running``). A name that fails to resolve, or resolves to nothing, keeps the pool it had
(logged once per change of outcome): a DNS hiccup must not empty a tier.

``endpoint_urls`` is pure; ``resolve`` is the one place that asks the resolver.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable

import anyio

from gateway.config import split_dns
from gateway.control.tier_status import TierBoard

logger = logging.getLogger(__name__)

Resolver = Callable[[str, int], Awaitable[list[str]]]


def endpoint_urls(dns: str, addresses: Iterable[str]) -> list[str]:
    """The endpoint URLs of a ``dns`` tier given the addresses its name resolved to: one per
    distinct address, sorted (IPv6 in brackets), with the configured scheme and port."""
    scheme, _, port = split_dns(dns)
    out = set()
    for address in addresses:
        try:
            ip = ipaddress.ip_address(address.split("%")[0])
        except ValueError:
            continue  # not an address: ignored
        host = f"[{ip}]" if ip.version == 6 else str(ip)
        out.add(f"{scheme}://{host}:{port}")
    return sorted(out)


async def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to now (OSError when it does not)."""
    found = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(sockaddr[0]) for *_, sockaddr in found]


async def resolve_pools(board: TierBoard, resolver: Resolver = resolve) -> None:
    """Resolve every ``dns`` tier's name once and update its pool on the board."""
    for name, tier in board.tiers.items():
        if tier.dns is None:
            continue
        _, host, port = split_dns(tier.dns)
        try:
            urls = endpoint_urls(tier.dns, await resolver(host, port))
        except OSError as exc:
            logger.warning("tier %s: %s did not resolve (%s); keeping %d endpoints", name,
                           host, exc, len(board.pool(name)))  # fmt: skip
            continue
        if not urls:
            logger.warning("tier %s: %s resolved to no address; keeping its endpoints", name, host)
            continue
        before = board.pool(name)
        if board.set_pool(name, urls):
            joined, left = sorted(set(urls) - set(before)), sorted(set(before) - set(urls))
            logger.info("tier %s: pool now %d endpoints (joined: %s; left: %s)", name, len(urls),
                        ", ".join(joined) or "none", ", ".join(left) or "none")  # fmt: skip


async def resolve_forever(board: TierBoard, interval: float, resolver: Resolver = resolve) -> None:
    """Resolve the ``dns`` tiers every ``interval`` seconds until cancelled."""
    while True:
        await anyio.sleep(interval)
        await resolve_pools(board, resolver)
