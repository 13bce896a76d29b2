"""Small named values and capped lists beside a ``SharedState`` (gateway/shared/state.py):
the reset coordinator's marks and history, in the same Redis with the same local fallback."""

from __future__ import annotations

from gateway.shared.state import SharedState, _Conn

MIRROR_SECONDS = 60.0  # how long a value read without an expiry is kept for a Redis outage
UNSENT_KEPT = 100  # pushes kept for Redis while it fails (the oldest dropped beyond)


class SharedRecords:
    """Small named values and capped lists beside a ``SharedState`` (same Redis, same
    fallback): the reset coordinator's marks and history. Values are strings (JSON)."""

    def __init__(self, state: SharedState) -> None:
        self._state = state
        # Pushes that stayed local while Redis failed (oldest first, bounded): written to Redis
        # before the next push or read of a list, so a record made during a short outage (a
        # reset under a load that stalled this process past op_timeout) is not lost to the
        # other replicas, nor to this one once it reads Redis again.
        self._unsent: list[tuple[str, str, int]] = []

    async def put(self, name: str, value: str | None, ttl: float) -> bool:
        """Set ``name`` for ``ttl`` seconds (``None`` deletes it). True when the shared store
        has it: Redis took the write, or there is no Redis (local state by design); False
        when the write stayed local because Redis failed or is being retried."""
        state, key = self._state, self._state._key("value", name)
        if value is None:
            state._local.values.pop(name, None)
            done: object = await state._run(lambda c: c.client.delete(key))
        else:
            state._local.values[name] = (value, state._clock() + ttl)
            px = max(1, int(ttl * 1000))
            done = await state._run(lambda c: c.client.set(key, value, px=px))
        return done is not None or state._url is None

    async def get(self, name: str) -> str | None:
        """The value of ``name``. Read from Redis, it is kept locally with its expiry: while
        Redis fails, this replica goes on with the last value it saw (a reset mark another
        replica wrote stays in force until it would have expired, not lifted at once)."""
        value, _ = await self.get_leased(name)
        return value

    async def get_leased(self, name: str) -> tuple[str | None, float | None]:
        """``get``, with the seconds the value has left (``None``: Redis holds it with no
        expiry, as nothing this gateway writes is; anyone who can reach Redis can write)."""
        state, key = self._state, self._state._key("value", name)

        async def read(conn: _Conn) -> tuple[object, int]:
            pipe = conn.client.pipeline(transaction=True)  # the value and its expiry together
            pipe.get(key)
            pipe.pttl(key)
            found, pttl = await pipe.execute()
            return found, int(pttl)

        read_back = await state._run(read)
        now = state._clock()
        if read_back is not None:
            found, pttl = read_back
            if found is None:
                state._local.values.pop(name, None)
                return None, None
            left = pttl / 1000 if pttl > 0 else None  # -1: no expiry set
            state._local.values[name] = (str(found), now + (left or MIRROR_SECONDS))
            return str(found), left
        value, until = state._local.values.get(name, (None, 0.0))
        return (value, until - now) if now < until else (None, None)

    async def push(self, name: str, value: str, keep: int = 100) -> None:
        """Prepend ``value`` to the list ``name``, keeping the newest ``keep``."""
        local = self._state._local.lists.setdefault(name, [])
        local.insert(0, value)
        del local[keep:]
        await self._send_unsent()
        if not await self._push(name, value, keep) and self._state._url is not None:
            self._unsent.append((name, value, keep))
            del self._unsent[:-UNSENT_KEPT]

    async def _push(self, name: str, value: str, keep: int) -> bool:
        """The push to Redis; False when it did not happen (local mode or a failure)."""
        key = self._state._key("list", name)

        async def push(conn: _Conn) -> bool:
            await conn.client.lpush(key, value)
            await conn.client.ltrim(key, 0, keep - 1)
            return True

        return bool(await self._state._run(push))

    async def _send_unsent(self) -> None:
        """Write the pushes that stayed local, oldest first, while Redis takes them."""
        while self._unsent and self._state.shared:
            name, value, keep = self._unsent[0]
            if not await self._push(name, value, keep):
                return
            self._unsent.pop(0)

    async def pop(self, name: str) -> str | None:
        """Take the oldest entry of the list ``name`` (``None`` when empty)."""
        state = self._state
        found = await state._run(lambda c: c.client.rpop(state._key("list", name)))
        if state.shared:
            return str(found) if found is not None else None
        local = state._local.lists.get(name, [])
        return local.pop() if local else None

    async def items(self, name: str, count: int = 100) -> list[str]:
        """The newest ``count`` entries of the list ``name``, newest first."""
        state = self._state
        await self._send_unsent()
        found = await state._run(lambda c: c.client.lrange(state._key("list", name), 0, count - 1))
        if found is not None:
            return [str(item) for item in found]
        return list(state._local.lists.get(name, [])[:count])
