"""One budget of failed key attempts per client address, shared by ``/admin`` and ``/v1``.

Each failed attempt takes one unit of the address' sliding window (across replicas when Redis is
there, gateway/shared/state.py). Once the window is spent the address is refused (429) for as
long as it stays spent, without its key being looked at: a right key and a wrong one get the
same answer, so the refusal tells a guesser nothing. Which addresses are refused is kept on this
replica (a dict lookup on the hot path, no Redis round trip for a request with a valid key); a
replica learns it from the address' first failed attempt it sees once the shared window is
spent, so another replica can check at most one more key of that address per window.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.shared.state import SharedState

GUESS_WINDOW = 60.0
_MAX_BLOCKED = 100_000  # addresses remembered as refused; past it the oldest go


class GuessBudget:
    """``limit`` failed key attempts per address per ``GUESS_WINDOW`` seconds (None: no bound)."""

    def __init__(
        self,
        limit: int | None,
        shared: Callable[[], SharedState | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.shared = shared
        self.clock = clock
        self.blocked: dict[str, float] = {}  # address -> until (clock)

    def refused_for(self, address: str) -> float | None:
        """Seconds ``address`` stays refused, or None if it may try a key."""
        if not self.blocked:
            return None
        until = self.blocked.get(address)
        if until is None:
            return None
        left = until - self.clock()
        if left <= 0:
            del self.blocked[address]
            return None
        return left

    async def failed(self, address: str) -> float | None:
        """Count one failed attempt of ``address``; the seconds it is now refused for, or None
        while its budget lasts (this attempt included)."""
        shared = self.shared()
        if self.limit is None or shared is None:
            return None
        decision = await shared.rate_limit(f"guess:{address}", self.limit, GUESS_WINDOW)
        if decision.allowed and decision.remaining > 0:
            return None
        # Spent: refused until its oldest attempt leaves the window (a whole window when this
        # attempt took the last unit: the shared log does not say when its oldest one leaves).
        wait = GUESS_WINDOW if decision.allowed else max(decision.retry_after, 1.0)
        self._block(address, wait)
        return None if decision.allowed else wait

    def _block(self, address: str, wait: float) -> None:
        now = self.clock()
        self.blocked.pop(address, None)
        self.blocked[address] = now + wait
        if len(self.blocked) > _MAX_BLOCKED:
            for old in [a for a, until in self.blocked.items() if until <= now]:
                del self.blocked[old]
            while len(self.blocked) > _MAX_BLOCKED:
                del self.blocked[next(iter(self.blocked))]
