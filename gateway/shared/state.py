"""State shared by gateway replicas through one Redis, with an in-process fallback.

``SharedState`` keeps per-tier in-flight counts, per-second request counts and per-key rate
limits. Contract:

- No method raises because of Redis (only ``ValueError`` for bad arguments). A Redis operation
  takes at most ``op_timeout`` (socket timeouts, ``asyncio.wait_for``, no redis-py retries). On
  a failure the instance switches to local state with the same semantics for this replica
  only, logs ONE warning and leaves Redis alone until its background task (run from ``start``
  to ``aclose``) reconnects, every ``retry_interval`` s; then it logs one info line. Before
  ``start``, after ``aclose`` and with ``redis_url=None`` the state is local.
- In-flight: this replica's counts are always kept locally (clamped at 0) and are the truth.
  ``begin``, ``end`` and a heartbeat (every ``replica_ttl / 3``) write the whole snapshot to
  ``{prefix}:inflight:{replica_id}`` (expiry ``replica_ttl``; a Lua script that ignores a write
  with an older sequence number, so late writes cannot roll it back) and add the id to
  ``{prefix}:replicas``. ``flush_delay`` 0: each ``begin`` and ``end`` awaits its write; > 0:
  one background write within ``flush_delay`` s carries every change since the last (no round
  trip on the request path; other replicas see counts that late; this replica's own reads,
  ``in_flight`` and ``request_rate``, write what is pending first). ``in_flight`` sums
  the registered hashes and drops ids whose hash has expired (crashed replicas). On reconnect
  the local snapshot is pushed: requests that ran through the outage are counted and their
  ``end`` cannot drive the sum negative.
- Traffic: ``begin`` counts a request in ``{prefix}:rate:{epoch second}`` (same script and
  round trip, by the requests counted since the last write; expiry 310 s); ``request_rate(w)``
  sums the ``ceil(w)`` latest buckets (the current, partial second included) with MGET and
  divides by ``w``.
- Rate limits: an exact sliding-window log (a sorted set per key, a Lua script): allowed when
  fewer than ``limit`` requests were allowed in the last ``per`` s; refusals are not recorded.
  Times come from ``clock`` (replicas need synchronised clocks); locally, per replica, with
  memory bounded: empty windows are dropped and at most a bounded number kept
  (gateway/shared/local.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlparse

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from gateway.shared.connection import REDIS_ERRORS, close_quietly, failure, open_client, where
from gateway.shared.local import BUCKET_TTL, LocalState, RateDecision
from gateway.shared.lua import INFLIGHT, RATE_LIMIT

logger = logging.getLogger(__name__)
T = TypeVar("T")
MAX_RATE_WINDOW = 300.0
_POOL_SIZE = 64  # Redis connections per replica
_RESERVED = "__"  # hash fields starting with this are bookkeeping, not tiers


@dataclass(frozen=True)
class _Conn:
    client: Redis
    inflight: AsyncScript
    ratelimit: AsyncScript


def _to_int(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


async def _sum_ints(values: Awaitable[list[Any]]) -> int:
    return sum(_to_int(v) for v in await values)


class SharedState:
    """Gateway state shared across replicas through Redis (see the module docstring)."""

    def __init__(
        self,
        redis_url: str | None,
        *,
        prefix: str = "mo:gateway",
        replica_id: str | None = None,
        clock: Callable[[], float] = time.time,
        op_timeout: float = 0.25,
        retry_interval: float = 2.0,
        replica_ttl: float = 15.0,
        flush_delay: float = 0.0,
    ) -> None:
        if min(op_timeout, retry_interval, replica_ttl) <= 0:
            raise ValueError("op_timeout, retry_interval and replica_ttl must be > 0")
        if flush_delay < 0:
            raise ValueError("flush_delay must be >= 0")
        scheme = urlparse(redis_url).scheme if redis_url is not None else None
        if scheme is not None and scheme not in {"redis", "rediss", "unix"}:
            raise ValueError(f"redis_url must be redis://, rediss:// or unix://, not {scheme!r}")
        self._url = redis_url
        self._where = where(redis_url)
        self._prefix = prefix
        self.replica_id = replica_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        self._clock = clock
        self._op_timeout = op_timeout
        self._retry_interval = retry_interval
        self._replica_ttl = replica_ttl
        self._owner = uuid.uuid4().hex
        self._seq = 0
        self._local = LocalState()
        self._conn: _Conn | None = None
        self._shared = False
        self._warned = False
        self._retry_at = 0.0
        self._beat_at = 0.0
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._flush_delay = flush_delay
        self._flush: asyncio.Task[bool] | None = None  # the write due after a change
        self._unsent_rate: dict[int, int] = {}  # second -> requests not yet written

    @property
    def shared(self) -> bool:
        """True while Redis is in use, False in local fallback."""
        return self._shared

    def _key(self, *parts: str) -> str:
        return ":".join((self._prefix, *parts))

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect; when Redis is unreachable, log one warning and run locally meanwhile."""
        if self._url is None or self._conn is not None:
            return
        client = open_client(self._url, self._op_timeout, max_connections=_POOL_SIZE)
        inflight, ratelimit = (client.register_script(s) for s in (INFLIGHT, RATE_LIMIT))
        self._conn = _Conn(client, inflight, ratelimit)
        self._closing = False
        await self._reconnect()
        self._task = asyncio.create_task(self._maintain(), name="shared-state")

    async def aclose(self, *, deregister: bool = True) -> None:
        """Stop the heartbeat and disconnect; ``deregister`` removes this replica's counts now
        (``False`` leaves them to expire after ``replica_ttl``, as a crash would)."""
        task, self._task = self._task, None
        self._closing = True  # also stops the loop if a cancellation gets lost in wait_for
        for pending in (task, self._flush):
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
        self._flush = None
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if deregister and self._shared:
            with contextlib.suppress(*REDIS_ERRORS):
                await asyncio.wait_for(self._deregister(conn.client), self._op_timeout)
        self._shared = False
        await close_quietly(conn.client)

    async def _deregister(self, client: Redis) -> None:
        await client.delete(self._key("inflight", self.replica_id))
        await client.srem(self._key("replicas"), self.replica_id)

    async def _maintain(self) -> None:
        """Heartbeat while shared; retry Redis ``retry_interval`` after a failure."""
        while not self._closing:
            due = self._beat_at if self._shared else self._retry_at
            now = time.monotonic()
            if now < due:  # wake at least every retry_interval: a failure moves retry_at
                await asyncio.sleep(min(due - now, self._retry_interval))
            else:
                await (self._beat() if self._shared else self._reconnect())

    async def _beat(self) -> None:
        self._beat_at = time.monotonic() + self._replica_ttl / 3
        await self._write_inflight()

    async def _reconnect(self) -> None:
        self._retry_at = time.monotonic() + self._retry_interval
        conn = self._conn
        if conn is None:
            return
        try:
            if self._warned:  # idle connections from before the outage are dead: drop them
                await conn.client.connection_pool.disconnect(inuse_connections=False)
            await asyncio.wait_for(conn.client.ping(), self._op_timeout)
        except REDIS_ERRORS as exc:
            self._fall_back(exc)
            return
        self._shared = True  # before the push: later writes carry higher sequence numbers
        self._beat_at = time.monotonic() + self._replica_ttl / 3
        if await self._write_inflight() and self._warned:
            self._warned = False
            logger.info("shared state: Redis at %s is back, using shared state", self._where)

    def _fall_back(self, exc: BaseException) -> None:
        self._shared = False
        self._retry_at = time.monotonic() + self._retry_interval
        if not self._warned:
            self._warned = True
            msg = "shared state: Redis at %s failed (%s), using local state until it is back"
            logger.warning(msg, self._where, failure(exc))

    async def _run(self, op: Callable[[_Conn], Awaitable[T]]) -> T | None:
        """``op`` against Redis, or ``None`` (local mode, or it failed: fall back)."""
        conn = self._conn
        if conn is None or not self._shared:
            return None
        try:
            return await asyncio.wait_for(op(conn), self._op_timeout)
        except REDIS_ERRORS as exc:
            self._fall_back(exc)
            return None

    # ------------------------------------------------------------------ in-flight and traffic

    async def begin(self, tier: str) -> None:
        """One request starts on ``tier``: in-flight +1, and 1 request in the traffic window."""
        second = int(self._clock())
        self._local.inflight[tier] = self._local.inflight.get(tier, 0) + 1
        self._local.count_request(second)
        if self._shared:
            self._unsent_rate[second] = self._unsent_rate.get(second, 0) + 1
        await self._changed()

    async def end(self, tier: str) -> None:
        """The request on ``tier`` ended: in-flight -1 (never below 0)."""
        self._local.inflight[tier] = max(0, self._local.inflight.get(tier, 0) - 1)
        await self._changed()

    def local_in_flight(self, tier: str) -> int:
        """This replica's requests in flight on ``tier`` now (no I/O)."""
        return self._local.inflight.get(tier, 0)

    async def _changed(self) -> None:
        """Write the snapshot now (``flush_delay`` 0), or have it written within the delay."""
        if not self._shared:
            return
        if not self._flush_delay:
            await self._write_inflight()
        elif self._flush is None:
            self._flush = asyncio.get_running_loop().create_task(self._write_later())

    async def _write_later(self) -> bool:
        await asyncio.sleep(self._flush_delay)
        self._flush = None  # changes from here on are for the next write
        return await self._write_inflight()

    async def _write_pending(self) -> None:
        """This replica's own reads see its changes: write what is pending now."""
        flush, self._flush = self._flush, None
        if flush is not None:
            flush.cancel()
            await self._write_inflight()

    async def _write_inflight(self) -> bool:
        """Write this replica's snapshot and the requests counted since the last write; True
        if done."""
        if not self._shared:
            return False
        self._seq += 1
        rate, self._unsent_rate = self._unsent_rate, {}
        counts = [x for tier, n in self._local.inflight.items() for x in (tier, n)]
        ttl_ms = max(1, int(self._replica_ttl * 1000))
        args: list[str | int] = [self._owner, self._seq, ttl_ms, self.replica_id, BUCKET_TTL]
        args.append(len(rate))
        args += [*rate.values(), *counts]
        keys = [self._key("inflight", self.replica_id), self._key("replicas")]
        keys += [self._key("rate", str(second)) for second in rate]
        return await self._run(lambda c: c.inflight(keys=keys, args=args)) is not None

    async def in_flight(self) -> dict[str, int]:
        """In-flight requests per tier, summed over all live replicas."""
        await self._write_pending()
        totals = await self._run(self._sum_inflight)
        return totals if totals is not None else dict(self._local.inflight)

    async def _sum_inflight(self, conn: _Conn) -> dict[str, int]:
        client, registry = conn.client, self._key("replicas")
        ids = sorted(map(str, await client.smembers(registry)))  # str: decode_responses
        pipe = client.pipeline(transaction=False)
        for replica in ids:
            pipe.hgetall(self._key("inflight", replica))
        hashes: list[dict[str, str]] = await pipe.execute() if ids else []
        dead = [replica for replica, h in zip(ids, hashes, strict=True) if not h]
        if dead:
            await client.srem(registry, *dead)
        totals: dict[str, int] = {}
        for h in hashes:
            for tier, value in h.items():
                if not tier.startswith(_RESERVED):
                    totals[tier] = totals.get(tier, 0) + _to_int(value)
        return totals

    async def request_rate(self, window: float) -> float:
        """Requests per second across replicas over the last ``window`` s (0 < window <= 300)."""
        if not 0 < window <= MAX_RATE_WINDOW:
            raise ValueError(f"window must be in (0, {MAX_RATE_WINDOW:g}] seconds, not {window}")
        await self._write_pending()
        now = int(self._clock())
        seconds = range(now - math.ceil(window) + 1, now + 1)
        keys = [self._key("rate", str(s)) for s in seconds]
        total = await self._run(lambda c: _sum_ints(c.client.mget(keys)))
        if total is None:
            total = sum(self._local.buckets.get(s, 0) for s in seconds)
        return total / window

    # ------------------------------------------------------------------ rate limits

    async def rate_limit(
        self, key_id: str, limit: int, per: float, *, cost: int = 1
    ) -> RateDecision:
        """Allow at most ``limit`` units per ``per`` seconds for ``key_id`` (sliding log); this
        request takes ``cost`` units (1 <= cost <= limit), all or none."""
        if limit < 1 or per <= 0 or not 1 <= cost <= limit:
            raise ValueError(
                f"need limit >= 1, per > 0 and 1 <= cost <= limit, not limit={limit}, "
                f"per={per}, cost={cost}"
            )
        now = self._clock()
        self._seq += 1
        member = f"{now!r}:{self._owner}:{self._seq}"  # unique across replicas
        args: list[str | int] = [repr(now), repr(float(per)), limit, member, cost]
        keys = [self._key("ratelimit", key_id)]
        raw = await self._run(lambda c: c.ratelimit(keys=keys, args=args))
        if raw is None:
            return self._local.rate_limit(key_id, limit, per, now, cost)
        allowed, retry_after, remaining = raw
        return RateDecision(bool(int(allowed)), max(0.0, float(retry_after)), int(remaining))
