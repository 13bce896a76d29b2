"""Reading a tier's SSE bytes into events: the gateway's one SSE reader. Pure: no I/O.

An event ends at a blank line: two line endings in a row, where a line ends with CRLF, LF or CR
(the SSE spec), so a stream frames its events with ``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``
(vLLM writes ``\\n\\n``; another engine may not). Every reader of a stream uses this module:

- ``EventBuffer`` holds a stream's bytes until they make complete events, however the bytes
  are cut. It keeps what followed the last boundary in one ``bytearray`` and searches only the
  bytes that arrived (and the three before them, where a boundary may begin): one event of
  many MB sent a few KB at a time costs time linear in its size, not the quadratic time of
  joining what was held to each chunk. ``held`` tells a relay how much an unfinished event
  holds, which it bounds (``max_answer_bytes``).
- ``complete_events`` and ``split_events`` cut a block of bytes at its boundaries, the events
  kept as they were sent (a relay forwards a tier's bytes as they came).
- ``payload`` reads one event's data: its ``data:`` lines' values joined by ``\\n`` (the SSE
  spec's multi-line data), comment lines (``:``) and other fields skipped; ``payloads`` reads a
  block's. ``is_done`` says a payload is OpenAI's ``[DONE]``; ``encode`` writes one event.
- ``read_payloads`` and ``aread_payloads``: the payloads of a stream read chunk by chunk, as
  a client reads one (the benchmarks, the load generator, tests).

What a payload says (an OpenAI chunk) is read by gateway/request/events/chunk.py.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator

# An event ends at a blank line, in any of SSE's three line endings (none is part of another).
BOUNDARIES = (b"\n\n", b"\r\n\r\n", b"\r\r")
_BOUNDARY = re.compile(b"(" + b"|".join(re.escape(mark) for mark in BOUNDARIES) + b")")
_OVERLAP = 3  # bytes before a new chunk a boundary may start in
DONE = b"data: [DONE]\n\n"


def complete_events(data: bytes) -> tuple[bytes, bytes]:
    """``data`` split at its last event boundary: (the complete events, the rest)."""
    if data.endswith(b"\n\n"):
        return data, b""
    cut = max(data.rfind(mark) + len(mark) if mark in data else 0 for mark in BOUNDARIES)
    return data[:cut], data[cut:]


def ends_event(block: bytes) -> bool:
    """Whether ``block`` ends at an event boundary (nothing of an event after it)."""
    return block.endswith(BOUNDARIES)


def split_events(block: bytes) -> list[tuple[bytes, bytes]]:
    """``block``'s events, each with the blank line that ended it, as sent (the last, when
    unended, with ``b""``)."""
    pieces = _BOUNDARY.split(block)  # event, its boundary, event, its boundary, ..., the rest
    return list(zip(pieces[::2], [*pieces[1::2], b""], strict=True))


def payload(event: bytes) -> bytes | None:
    """One event's data (``event`` without or with its boundary): the values of its ``data``
    lines joined by ``\\n`` (one space after a line's colon dropped, as SSE says), surrounding
    whitespace dropped (a payload is JSON or ``[DONE]``); None when it has no ``data`` line
    (comments only, say)."""
    if event.startswith(b"data:") and b"\n" not in event and b"\r" not in event:
        return event[5:].strip()  # the usual event: one data line (its space stripped too)
    values = []
    for line in event.splitlines():  # CRLF, LF and CR: SSE's line endings, no others
        if line.startswith(b"data:"):
            value = line[5:]
            values.append(value[1:] if value.startswith(b" ") else value)
        elif line == b"data":
            values.append(b"")
    if not values:
        return None
    return (values[0] if len(values) == 1 else b"\n".join(values)).strip()


def payloads(block: bytes) -> list[bytes]:
    """The data of each event in ``block`` that has some, in order (an unended last event's
    too)."""
    if b"\r" in block:
        events = [event for event, _end in split_events(block)]
    else:  # vLLM's framing: LF alone, split without the regex
        events = block.split(b"\n\n")
    found = []
    for event in events:
        data = payload(event) if event else None  # after the last boundary: nothing
        if data is not None:
            found.append(data)
    return found


def is_done(data: bytes) -> bool:
    """Whether a payload is OpenAI's end of stream, ``[DONE]``."""
    return data == b"[DONE]"


def encode(data: bytes) -> bytes:
    """One event carrying ``data`` (a line of it each ``data:`` line), framed with ``\\n\\n``."""
    if b"\n" not in data and b"\r" not in data:
        return b"data: " + data + b"\n\n"
    return b"".join(b"data: " + line + b"\n" for line in data.splitlines()) + b"\n"


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
        cut = max(self._cut(mark, start) for mark in BOUNDARIES)
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


def read_payloads(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The payloads of a stream's events, each as soon as its event is complete."""
    buffer = EventBuffer()
    for chunk in chunks:
        yield from payloads(buffer.feed(chunk))
    yield from payloads(buffer.rest())


async def aread_payloads(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """``read_payloads`` of a stream read asynchronously."""
    buffer = EventBuffer()
    async for chunk in chunks:
        for data in payloads(buffer.feed(chunk)):
            yield data
    for data in payloads(buffer.rest()):
        yield data
