"""The one way the gateway opens and closes a Redis client (shared/state.py, shared/leader.py).

Every step is bounded by the caller's ``op_timeout``: waiting for a pooled connection, connecting,
each socket read and write; redis-py never retries (one try, then the caller's local fallback).
The pool is a ``BlockingConnectionPool``: a burst of callers queues briefly for a free
connection instead of failing with "Too many connections". Nothing here logs; log lines name
the server with ``where`` (never the URL, which may carry a password).
"""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import urlparse

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

# What a Redis operation may raise when Redis is slow, gone or refuses: callers fall back.
REDIS_ERRORS = (RedisError, ConnectionError, TimeoutError, OSError)


def where(redis_url: str | None) -> str:
    """The host (or socket path) of ``redis_url`` for log lines; ``""`` without one."""
    url = urlparse(redis_url) if redis_url is not None else None
    return (url.hostname or url.path) if url else ""


def open_client(redis_url: str, op_timeout: float, max_connections: int | None = None) -> Redis:
    """A client over its own bounded pool (``max_connections``: redis-py's default when None).

    No I/O: the first command connects. Replies are decoded to ``str``."""
    t = op_timeout
    options: dict[str, Any] = {"socket_timeout": t, "socket_connect_timeout": t}
    if max_connections is not None:
        options["max_connections"] = max_connections
    pool = BlockingConnectionPool.from_url(
        redis_url, timeout=t, decode_responses=True, retry=Retry(NoBackoff(), 0), **options
    )
    return Redis.from_pool(pool)


async def close_quietly(client: Redis) -> None:
    """Close ``client`` and its pool; a Redis that is already gone is not an error."""
    with contextlib.suppress(*REDIS_ERRORS):
        await client.aclose()


def failure(exc: BaseException) -> str:
    """Why a Redis operation failed, on one line (for the fall-back warning)."""
    return " ".join(str(exc).split()) or type(exc).__name__
