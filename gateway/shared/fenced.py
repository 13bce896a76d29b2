"""One named value beside a ``SharedState`` that only the newest leader may write.

``FencedValue(state, name)`` keeps a text (JSON) in ``{prefix}:fenced:{name}`` and the largest
fencing token that wrote it in ``{prefix}:fenced:{name}:fence``. ``write(text, token)`` is one
Lua script: refused (False) when a larger token has written, so a leader that lost the lock
(gateway/shared/leader.py) and wakes up late cannot replace what its successor measured. Values
have no expiry: they describe the tiers, not a process.

Without Redis (``redis_url=None``) the value lives in this process (each replica its own, by
design). While Redis fails a write stays local and ``write`` says False; ``read`` then returns
the last value this replica saw or wrote. No method raises because of Redis.
"""

from __future__ import annotations

from gateway.shared.state import SharedState

_WRITE_LUA = """
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
local token = tonumber(ARGV[2])
if token < fence then return 0 end
redis.call('SET', KEYS[2], token)
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""


class FencedValue:
    """See the module docstring."""

    def __init__(self, state: SharedState, name: str) -> None:
        self._state = state
        self._key = state._key("fenced", name)
        self._local: tuple[str, int] | None = None  # (text, token): written or last read

    async def write(self, text: str, token: int) -> bool:
        """Store ``text`` unless a larger token wrote already. True when the shared store
        has it (Redis took it, or there is no Redis); False when refused or kept local."""
        state = self._state
        if self._local is not None and state._url is None and token < self._local[1]:
            return False
        keys = [self._key, f"{self._key}:fence"]
        done = await state._run(lambda c: c.client.eval(_WRITE_LUA, 2, *keys, text, str(token)))
        if done is None:  # no Redis, or it failed: this replica keeps it
            self._local = (text, token)
            return state._url is None
        if int(done) == 1:
            self._local = (text, token)
            return True
        return False

    async def read(self) -> str | None:
        """The stored text (Redis first; the last seen or written while it is away)."""
        found = await self._state._run(lambda c: c.client.get(self._key))
        if found is not None:
            token = self._local[1] if self._local is not None else 0
            self._local = (str(found), token)
            return str(found)
        return self._local[0] if self._local is not None else None
