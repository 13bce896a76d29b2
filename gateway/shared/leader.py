"""One leader among gateway replicas: a Redis lock with an expiry and a fencing token.

- ``acquire``: if ``key`` is free, a Lua script INCRs ``{key}:fence`` and SETs ``key`` to
  ``"holder|token"`` expiring in ``ttl`` s; returns the token if this holder got or already holds
  the lock (expiry refreshed), else ``None``. Tokens only grow, so a stale leader's writes can be
  refused. ``renew`` (compare-and-PEXPIRE, False once lost) and ``release`` (compare-and-DEL)
  act only on this holder's value. ``token()``: the token while this instance believes it leads
  (``ttl`` s from the start of its last good acquire/renew); ``current()``: holder and token.
- Without Redis (``redis_url=None``) or while it is unreachable, this replica leads ITSELF with
  tokens from a local counter (above any token it has seen), so replicas cut off from Redis may
  each lead: without Redis, run one replica. A failure logs ONE warning; Redis is tried again
  ``retry_interval`` s later (on a call) and one info line says it is back. A Redis lease ends
  when Redis fails, a local one when Redis is back (``renew`` returns False).
- With a ``redis_url``, nothing leads before ``start`` or after ``aclose`` (which releases).
  No method raises because of Redis; an operation takes at most ``op_timeout`` s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from gateway.shared.connection import REDIS_ERRORS, close_quietly, failure, open_client, where

logger = logging.getLogger(__name__)
T = TypeVar("T")

_ACQUIRE_LUA = """
local held = redis.call('GET', KEYS[1])
if held then
  local holder, token = string.match(held, '^(.*)|(%d+)$')
  if holder ~= ARGV[1] then return 0 end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(token)
end
local token = math.max(redis.call('INCR', KEYS[2]), tonumber(ARGV[3]) + 1)  -- above any seen
redis.call('SET', KEYS[2], token)
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
return token
"""
_IF_MINE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call({}) end return 0"
_RENEW_LUA = _IF_MINE.format("'PEXPIRE', KEYS[1], ARGV[2]")
_RELEASE_LUA = _IF_MINE.format("'DEL', KEYS[1]")


@dataclass(frozen=True)
class _Conn:
    client: Redis
    acquire: AsyncScript
    renew: AsyncScript
    release: AsyncScript


class LeaderLock:
    """A leader lock shared through Redis (see the module docstring)."""

    def __init__(
        self,
        redis_url: str | None,
        key: str,
        ttl: float,
        *,
        holder: str | None = None,
        op_timeout: float = 0.5,
        retry_interval: float = 2.0,
    ) -> None:
        if min(ttl, op_timeout, retry_interval) <= 0:
            raise ValueError("ttl, op_timeout and retry_interval must be > 0")
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.key, self.ttl, self._url = key, ttl, redis_url
        self._where = where(redis_url)
        self._op_timeout, self._retry_interval = op_timeout, retry_interval
        self._px = str(max(1, int(ttl * 1000)))  # the expiry in ms
        self._conn: _Conn | None = None
        self._down, self._retry_at = False, 0.0  # Redis failed; tried again from _retry_at on
        self._lease: Literal["redis", "local"] | None = None  # where this instance leads
        self._token: int | None = None
        self._until = 0.0  # time.monotonic() up to which this instance believes it leads
        self._seen = 0  # the largest token seen: local tokens continue from it

    async def start(self) -> None:
        """Connect; when Redis is unreachable, log one warning and lead locally meanwhile."""
        if self._url is None or self._conn is not None:
            return
        client = open_client(self._url, self._op_timeout)
        scripts = (client.register_script(s) for s in (_ACQUIRE_LUA, _RENEW_LUA, _RELEASE_LUA))
        self._conn = _Conn(client, *scripts)
        await self._run(lambda c: c.client.ping())

    async def aclose(self) -> None:
        """Release the lock if held, then disconnect."""
        await self.release()
        conn, self._conn = self._conn, None
        if conn is not None:
            await close_quietly(conn.client)

    async def acquire(self) -> int | None:
        """This holder's fencing token if it got or holds the lock, else ``None``."""
        began = time.monotonic()
        if self._url is not None and self._conn is None:  # not started, or closed
            return None
        if self._redis_usable():
            keys, args = [self.key, f"{self.key}:fence"], [self.holder, self._px, str(self._seen)]
            raw = await self._run(lambda c: c.acquire(keys=keys, args=args))
            if raw is not None:  # 0: another holder has the lock
                return self._hold("redis", int(raw), began)
        local = self._token if self._lease == "local" and self._token else self._seen + 1
        return self._hold("local", local, began)

    async def renew(self) -> bool:
        """Extend the lock by ``ttl``; False if it was lost (a local lease: Redis is back)."""
        began = time.monotonic()
        if self._token is None or self._lease is None:
            return False
        if self._lease == "local":
            ping = self._redis_usable() and await self._run(lambda c: c.client.ping()) is not None
            kept = self._url is None or (self._conn is not None and not ping)
        else:
            args = [f"{self.holder}|{self._token}", self._px]
            kept = bool(await self._run(lambda c: c.renew(keys=[self.key], args=args)))
        return self._hold(self._lease, self._token if kept else 0, began) is not None

    async def release(self) -> None:
        """Give the lock up (only if this holder still holds it)."""
        if self._lease == "redis" and self._token is not None:
            value = f"{self.holder}|{self._token}"
            await self._run(lambda c: c.release(keys=[self.key], args=[value]))
        self._lose()

    async def current(self) -> tuple[str | None, int | None]:
        """The holder and token of the lock now (``(None, None)``: nobody leads)."""
        if self._redis_usable():
            values = await self._run(lambda c: c.client.mget([self.key]))  # None: failed
            if values is not None:  # "holder|token"
                holder, _, digits = str(values[0] or "").rpartition("|")
                token = int(digits) if holder and digits.isdigit() else None
                self._seen = max(self._seen, token or 0)
                return (holder, token) if token is not None else (None, None)
        token = self.token() if self._lease == "local" else None
        return (self.holder, token) if token is not None else (None, None)

    @property
    def cut_off(self) -> bool:
        """This instance leads alone because its Redis is unreachable (not: no Redis at all)."""
        return self._lease == "local" and self._url is not None

    def token(self) -> int | None:
        """This holder's token while it believes it leads, else ``None``."""
        return self._token if time.monotonic() < self._until else None

    def _hold(self, lease: Literal["redis", "local"], token: int, began: float) -> int | None:
        """Lead with ``token`` until ``ttl`` s after ``began``; token 0: lead no more."""
        if token <= 0:
            self._lose()
            return None
        self._lease, self._token, self._until = lease, token, began + self.ttl
        self._seen = max(self._seen, token)
        return token

    def _lose(self) -> None:
        self._lease, self._token, self._until = None, None, 0.0

    def _redis_usable(self) -> bool:
        return self._conn is not None and (not self._down or time.monotonic() >= self._retry_at)

    async def _run(self, op: Callable[[_Conn], Awaitable[T]]) -> T | None:
        """``op`` against Redis, or ``None`` when it failed (then: local until retry_at)."""
        if (conn := self._conn) is None:
            return None
        try:
            result = await asyncio.wait_for(op(conn), self._op_timeout)
        except REDIS_ERRORS as exc:
            self._retry_at = time.monotonic() + self._retry_interval
            if self._lease == "redis":
                self._lose()  # cannot be confirmed any more
            if not self._down:
                self._down = True
                msg = "leader lock: Redis at %s failed (%s), leading alone until it is back"
                logger.warning(msg, self._where, failure(exc))
            return None
        if self._down:
            self._down = False
            logger.info("leader lock: Redis at %s is back", self._where)
        return result
