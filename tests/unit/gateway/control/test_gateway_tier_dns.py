"""Pools named by DNS: addresses to endpoint URLs (pure), the board following resolutions."""

from __future__ import annotations

import asyncio
import socket

from backends.metrics import TierMetrics
from backends.tier_state import TierState
from gateway.config import TierEndpoint
from gateway.control.tier_dns import endpoint_urls, resolve, resolve_pools
from gateway.control.tier_status import Scrape, TierBoard

DNS_TIER = TierEndpoint.model_validate({"name": "int8", "dns": "tier-int8.ns.svc:8000"})
STATIC = TierEndpoint(name="fp16", base_url="http://127.0.0.1:1")


def test_addresses_become_sorted_distinct_urls() -> None:
    found = ["10.0.0.2", "10.0.0.1", "10.0.0.2", "fd00::1", "not-an-ip"]
    assert endpoint_urls("http://h:8000", found) == [
        "http://10.0.0.1:8000",
        "http://10.0.0.2:8000",
        "http://[fd00::1]:8000",
    ]
    assert endpoint_urls("https://h:443", ["10.0.0.9"]) == ["https://10.0.0.9:443"]


def test_a_dns_pool_follows_what_the_name_resolves_to() -> None:
    board = TierBoard([STATIC, DNS_TIER])
    answers: list[list[str] | OSError] = [
        ["10.0.0.1", "10.0.0.2"],
        ["10.0.0.2", "10.0.0.3"],
        socket.gaierror("Name or service not known"),
        [],
    ]
    asked: list[tuple[str, int]] = []

    async def resolver(host: str, port: int) -> list[str]:
        asked.append((host, port))
        answer = answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer

    async def scenario() -> None:
        assert board.pool("int8") == ["http://tier-int8.ns.svc:8000"]  # before any answer
        await resolve_pools(board, resolver)
        assert board.pool("int8") == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
        first = "http://10.0.0.1:8000"
        board.record("int8", Scrape(True, TierMetrics(requests_waiting=2.0), 0.0), first)
        board.set_endpoint_state("int8", "http://10.0.0.1:8000", TierState.DRAINING)
        await resolve_pools(board, resolver)  # .1 left, .3 joined
        assert board.pool("int8") == ["http://10.0.0.2:8000", "http://10.0.0.3:8000"]
        assert board.state("int8") is TierState.READY
        await resolve_pools(board, resolver)  # resolution fails: the pool stays
        await resolve_pools(board, resolver)  # resolves to nothing: the pool stays
        assert board.pool("int8") == ["http://10.0.0.2:8000", "http://10.0.0.3:8000"]
        board.set_pool("int8", ["http://10.0.0.1:8000"])  # .1 back: nothing of before remains
        (status,) = board.endpoint_statuses("int8")
        assert (status.state, status.requests_waiting) == (TierState.READY, 0.0)

    asyncio.run(scenario())
    assert asked == [("tier-int8.ns.svc", 8000)] * 4
    assert board.pool("fp16") == ["http://127.0.0.1:1"]  # a static tier is never resolved


def test_resolve_asks_the_system_resolver() -> None:
    assert set(asyncio.run(resolve("localhost", 80))) & {"127.0.0.1", "::1"}
