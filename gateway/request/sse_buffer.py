"""Holding a tier's SSE bytes until they make complete events (pure).

The relays forward complete events only where they must read them (a stream that can be
continued, or an error event to replace; gateway/request/resumable.py, relay.py). An
``EventBuffer`` keeps what followed the last event boundary in one ``bytearray`` and searches
only the bytes that arrived (and the three before them, where a boundary may begin) for a new
boundary: one event of many MB sent a few KB at a time costs time linear in its size, not the
quadratic time of joining what was held to each chunk. ``held`` tells the relay how much an
unfinished event holds, which the relay bounds (``max_answer_bytes``: past it the tier failed).
"""

from __future__ import annotations

from gateway.config import TierEndpoint
from gateway.request.continuation import complete_events
from gateway.request.upstream import UpstreamFailed

# An event ends at a blank line, in any of SSE's three line endings (as continuation.py).
_BOUNDARIES = (b"\n\n", b"\r\n\r\n", b"\r\r")
_OVERLAP = 3  # bytes before a new chunk a boundary may start in


class EventBuffer:
    """A stream's bytes in, its complete events out (see the module docstring)."""

    def __init__(self) -> None:
        self._rest = bytearray()

    @property
    def held(self) -> int:
        """Bytes of an event not yet complete."""
        return len(self._rest)

    def feed(self, chunk: bytes) -> bytes:
        """The events ``chunk`` completes (with those it carries whole), ``b""`` for none."""
        if not self._rest:  # the usual case: events arrive whole, or a chunk starts one
            events, rest = complete_events(chunk)
            self._rest += rest
            return events
        start = max(len(self._rest) - _OVERLAP, 0)
        self._rest += chunk
        cut = max(self._cut(mark, start) for mark in _BOUNDARIES)
        if cut == 0:
            return b""
        events = bytes(self._rest[:cut])
        del self._rest[:cut]
        return events

    def _cut(self, mark: bytes, start: int) -> int:
        at = self._rest.rfind(mark, start)
        return at + len(mark) if at >= 0 else 0

    def rest(self) -> bytes:
        """What followed the last boundary (the stream ended), handed over once."""
        rest = bytes(self._rest)
        self._rest.clear()
        return rest


def event_too_large(tier: TierEndpoint, limit: int) -> UpstreamFailed:
    """The failure of a tier that sent one event larger than ``limit`` bytes (still unended)."""
    return UpstreamFailed(tier.name, f"it sent an SSE event larger than max_answer_bytes ({limit})")
