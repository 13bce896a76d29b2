"""Which endpoint of a tier's pool takes a request, in which order (pure).

``choose_endpoints(endpoints, session_key, limits, turn)`` orders one tier's endpoints for a
request:

1. endpoints not ``ready`` (down, starting, draining, resetting) are left out;
2. saturated ones (``requests_waiting`` or ``kv_usage`` above the policy's ``saturation``
   thresholds, the same rule the router applies to whole tiers) are left out too, unless every
   ready endpoint is saturated: then they are all kept, least loaded first (the router only
   sends a request to a saturated tier when it was pinned there);
3. the rest go least loaded first: fewer waiting requests, then lower KV usage (in whole
   percent, so tiny differences do not decide), then fewer running requests; endpoints that
   tie take turns (``turn``, a count the caller advances per request: the endpoint at that
   position of the pool first, then the next), since a scrape that shows no load at all says
   nothing of the requests sent since (short answers on a fast machine finish between two
   scrapes: by URL order every one of them went to the same endpoint);
4. affinity: with a session key (``x-session-id`` header or OpenAI's ``user`` field,
   ``session_key``) the endpoint with the highest rendezvous (HRW) score among the ready ones
   goes first, so a conversation keeps landing where its prefix is cached. HRW moves only the
   sessions of an endpoint that leaves: the others keep theirs. When that endpoint is
   saturated (or not ready) the order is the least-loaded one.

The order is the failover order: a connect error or a 503 before the first byte tries the next
endpoint of the same tier before the next tier of the chain (gateway/request/stream/relay.py).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.tier_state import TierState

SESSION_HEADER = "x-session-id"
MAX_SESSION_KEY = 256  # characters of a session key that count


@dataclass(frozen=True)
class EndpointStatus:
    """What the gateway knows about one endpoint of a tier (its last scrape, its marks)."""

    url: str
    state: TierState
    requests_waiting: float = 0.0  # vllm:num_requests_waiting
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0..1
    requests_running: float = 0.0  # vllm:num_requests_running


@dataclass(frozen=True)
class Saturation:
    """The policy's saturation thresholds (gateway/policy/schema.py ``SaturationPolicy``)."""

    max_requests_waiting: float
    max_kv_usage: float


@dataclass(frozen=True)
class EndpointChoice:
    """The endpoints to try in order, and whether the first is the session's own."""

    order: list[str]
    affinity: bool = False  # the first endpoint is the session's HRW endpoint


def saturated(endpoint: EndpointStatus, limits: Saturation) -> bool:
    return (
        endpoint.requests_waiting > limits.max_requests_waiting
        or endpoint.kv_usage > limits.max_kv_usage
    )


def load_key(endpoint: EndpointStatus) -> tuple[float, int, float, str]:
    """Least loaded first: waiting, then KV usage in whole percent, then running, then URL."""
    kv_percent = round(endpoint.kv_usage * 100)
    return (endpoint.requests_waiting, kv_percent, endpoint.requests_running, endpoint.url)


def hrw_score(session_key: str, url: str) -> int:
    """The rendezvous weight of ``url`` for ``session_key`` (stable across processes)."""
    digest = hashlib.blake2b(f"{session_key}\x00{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def choose_endpoints(
    endpoints: Sequence[EndpointStatus],
    session_key: str | None,
    limits: Saturation,
    turn: int = 0,
) -> EndpointChoice:
    """The endpoints of one tier to try, in order (see the module docstring)."""
    ready = [e for e in endpoints if e.state == TierState.READY]
    if not ready:
        return EndpointChoice([])
    fresh = [e for e in ready if not saturated(e, limits)]
    position = {e.url: i for i, e in enumerate(endpoints)}

    def taking_turns(e: EndpointStatus) -> tuple[float, int, float, int]:
        waiting, kv_percent, running, _ = load_key(e)
        return (waiting, kv_percent, running, (position[e.url] - turn) % len(endpoints))

    candidates = sorted(fresh or ready, key=taking_turns)
    if session_key:
        own = max(ready, key=lambda e: (hrw_score(session_key, e.url), e.url))
        if own in fresh:
            rest = [e.url for e in candidates if e.url != own.url]
            return EndpointChoice([own.url, *rest], affinity=True)
    return EndpointChoice([e.url for e in candidates])


def session_key(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """A request's session key: the ``x-session-id`` header, else the body's ``user`` field
    (strings only, bounded); ``None`` without either."""
    for value in (headers.get(SESSION_HEADER), body.get("user")):
        if isinstance(value, str) and value.strip():
            return value.strip()[:MAX_SESSION_KEY]
    return None


@functools.lru_cache(maxsize=1024)
def endpoint_id(url: str) -> str:
    """A short stable name for an endpoint, for clients not told addresses (``e-`` + 8 hex)."""
    return "e-" + hashlib.sha256(url.encode()).hexdigest()[:8]
