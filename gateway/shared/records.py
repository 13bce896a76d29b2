"""Small named values and capped lists beside a ``SharedState`` (gateway/shared/state.py):
the reset coordinator's marks and history, in the same Redis with the same local fallback."""

from __future__ import annotations

from gateway.shared.state import SharedState, _Conn


class SharedRecords:
    """Small named values and capped lists beside a ``SharedState`` (same Redis, same
    fallback): the reset coordinator's marks and history. Values are strings (JSON)."""

    def __init__(self, state: SharedState) -> None:
        self._state = state

    async def put(self, name: str, value: str | None, ttl: float) -> None:
        """Set ``name`` for ``ttl`` seconds (``None`` deletes it)."""
        state, key = self._state, self._state._key("value", name)
        if value is None:
            state._local.values.pop(name, None)
            await state._run(lambda c: c.client.delete(key))
            return
        state._local.values[name] = (value, state._clock() + ttl)
        await state._run(lambda c: c.client.set(key, value, px=max(1, int(ttl * 1000))))

    async def renew(self, name: str, ttl: float) -> None:
        """Let ``name`` live ``ttl`` more seconds, whatever its value is now (nothing when it is
        gone). Never rewrites the value: a renewal that read it and wrote it back could put a
        value back that changed in between (a reset mark lifted or moved on)."""
        state, key = self._state, self._state._key("value", name)
        value, until = state._local.values.get(name, (None, 0.0))
        if value is not None and state._clock() < until:
            state._local.values[name] = (value, state._clock() + ttl)
        await state._run(lambda c: c.client.pexpire(key, max(1, int(ttl * 1000))))

    async def get(self, name: str) -> str | None:
        state = self._state
        found = await state._run(lambda c: c.client.get(state._key("value", name)))
        if state.shared:
            return str(found) if found is not None else None
        value, until = state._local.values.get(name, (None, 0.0))
        return value if state._clock() < until else None

    async def push(self, name: str, value: str, keep: int = 100) -> None:
        """Prepend ``value`` to the list ``name``, keeping the newest ``keep``."""
        state, key = self._state, self._state._key("list", name)
        local = state._local.lists.setdefault(name, [])
        local.insert(0, value)
        del local[keep:]

        async def push(conn: _Conn) -> None:
            await conn.client.lpush(key, value)
            await conn.client.ltrim(key, 0, keep - 1)

        await state._run(push)

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
        found = await state._run(lambda c: c.client.lrange(state._key("list", name), 0, count - 1))
        if found is not None:
            return [str(item) for item in found]
        return list(state._local.lists.get(name, [])[:count])
