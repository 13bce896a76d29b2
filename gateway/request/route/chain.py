"""Opening a request on its chain of tiers: the first endpoint that connects and answers.

``open_chain`` tries the plan's tiers in order, each tier's endpoints in the order the
endpoint choice gave; a connect error, an endpoint gone before answering, no first byte in
time or a 503 moves on to the next endpoint of the tier, then to the next tier. Once one has
answered, that answer is the answer (gateway/request/stream/relay.py relays it;
gateway/request/stream/resume.py opens a stream's continuation the same way).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any, Protocol

import anyio
import httpx

from gateway.config import TierEndpoint
from gateway.errors import SERVER_ERROR, APIError
from gateway.request.exchange import Exchange
from gateway.request.kind import Kind
from gateway.request.upstream.client import (
    Upstream,
    UpstreamLost,
    UpstreamUnavailable,
    aclose_quietly,
)

NO_SERVER = "no model server is available; retry shortly"  # what clients are told


class Asked(Protocol):
    """What a request asks, as every tier of its chain is asked it: the request value
    (gateway/request/route/decided.py), or its continuation
    (gateway/request/stream/resume.py)."""

    @property
    def kind(self) -> Kind: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def first_byte(self) -> float:  # seconds a tier may take to its first byte (inf: no bound)
        ...

    def body_for(self, tier: str) -> Mapping[str, Any]:  # the body planned for ``tier``
        ...


async def open_chain(
    upstream: Upstream,
    tiers: list[list[TierEndpoint]],
    asked: Asked,
    exchange: Exchange,
) -> tuple[TierEndpoint, httpx.Response]:
    """Open the request ``asked`` on the first endpoint that connects, answers within
    ``asked.first_byte`` seconds and does not answer 503. ``tiers``: the chain, each tier as
    its endpoints in the order to try (gateway/request/route/endpoint_choice.py; one for a
    single-server tier), so a failing endpoint moves on to the next endpoint of its tier
    before the next tier. Returns the endpoint that answered (its ``base_url`` is the
    endpoint's URL) and its response."""
    failures: list[str] = []
    path, headers, first_byte = asked.kind.path, asked.headers, asked.first_byte
    for endpoints in tiers:
        if not endpoints:
            continue
        await exchange.acquire(endpoints[0].name)
        for tier in endpoints:
            where = _where(tier, len(endpoints))
            response = None
            # No cancel scope for a whole answer (no first-byte bound): one costs CPU per request.
            bound = nullcontext() if first_byte == float("inf") else anyio.move_on_after(first_byte)
            try:
                with bound:
                    body = asked.body_for(tier.name)
                    response = await upstream.send(tier, "POST", path, body, headers)
            except UpstreamLost:
                failures.append(f"{where} went away before answering")
                exchange.fell_back(tier.name, "lost")
                continue
            except UpstreamUnavailable:
                failures.append(f"{where} unreachable")
                exchange.fell_back(tier.name, "unreachable")
                continue
            if response is None:  # cancelling the send closed its connection: vLLM aborts
                failures.append(f"{where} did not answer within {first_byte:g} s")
                exchange.fell_back(tier.name, "timeout")
                continue
            if response.status_code == 503:
                await aclose_quietly(response)
                failures.append(f"{where} answered 503")
                exchange.fell_back(tier.name, "503")
                continue
            exchange.endpoint = tier.base_url
            return tier, response
    await exchange.release()
    raise APIError(
        503,
        f"no tier is available ({', '.join(failures) or 'no endpoint is ready'}); retry shortly",
        SERVER_ERROR,
        code="no_tier_available",
        headers={"Retry-After": "5"},
        public=NO_SERVER,
    )


def _where(endpoint: TierEndpoint, pool_size: int) -> str:
    """A failure's place: the tier, and the endpoint when its pool has several."""
    return endpoint.name if pool_size == 1 else f"{endpoint.name} at {endpoint.base_url}"
