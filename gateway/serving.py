"""What the connection layer (gateway/server.py) and the app share on one event loop.

uvicorn builds a protocol object per connection and knows nothing of the app's objects, so
the two meet here, one ``ServingState`` per event loop (a served gateway has one loop; tests
run several servers, each on its own loop, and never share a state):

- counts the connection layer keeps for /metrics: connections aborted because their client
  stopped reading (``send_timeout``), answers ended by a shutdown (``shutdown_timeout``);
- the answers in progress (streams, and whole answers awaited from a tier), each with a
  callback that ends it with a 503 ``shutting_down`` (an error event in a stream); on shutdown
  the connection layer calls ``begin_drain(seconds)``: answers still in progress that many
  seconds later are ended (Envoy's drain, NGINX's ``worker_shutdown_timeout``). One that
  starts after that is ended at once.

Nothing happens at import time but creating an empty mapping.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


@dataclass
class ServingState:
    """One event loop's counts and answers in progress (see the module docstring)."""

    slow_clients_aborted: int = 0
    answers_drained: int = 0
    _streams: dict[object, Callable[[], None]] = field(default_factory=dict)
    _timer: asyncio.TimerHandle | None = None
    drained: bool = False  # the drain's deadline has passed: open streams were ended

    @property
    def open_answers(self) -> int:
        return len(self._streams)

    def track(self, key: object, end: Callable[[], None]) -> None:
        """Track an answer in progress; ``end`` ends it with a 503 ``shutting_down`` (called
        on the loop)."""
        if self.drained:
            self._end(end)
            return
        self._streams[key] = end

    def untrack(self, key: object) -> None:
        self._streams.pop(key, None)

    def begin_drain(self, seconds: float) -> None:
        """The server is shutting down: end the answers in progress ``seconds`` from now
        (idempotent; the first call sets the deadline). Called on the loop."""
        if self._timer is None and not self.drained:
            self._timer = asyncio.get_running_loop().call_later(seconds, self.end_streams)

    def end_streams(self) -> None:
        """End every answer in progress now."""
        self._timer = None
        self.drained = True
        ends = list(self._streams.values())
        self._streams.clear()
        if ends:
            logger.info("shutting down: ending %d answer(s) in progress with 503", len(ends))
        for end in ends:
            self._end(end)

    def _end(self, end: Callable[[], None]) -> None:
        self.answers_drained += 1
        end()


_STATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ServingState] = (
    weakref.WeakKeyDictionary()
)


def serving_state(loop: asyncio.AbstractEventLoop | None = None) -> ServingState:
    """The state of ``loop`` (default: the running loop), made on first use."""
    loop = loop or asyncio.get_running_loop()
    state = _STATES.get(loop)
    if state is None:
        state = _STATES[loop] = ServingState()  # holds no reference to its loop
    return state
