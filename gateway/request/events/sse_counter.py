"""A relayed stream's output tokens, read from the bytes as they pass.

``SSECounter`` watches a relayed stream for the usage object vLLM sends when asked
(gateway/request/events/stream_usage.py asks for it), and otherwise counts the events that carry
choices (one token each in vLLM). It reads lines, not whole events, so it stays cheap on the
relay's hot path; the events themselves are read by the one SSE reader
(gateway/request/events/sse.py) where an event's content matters.
"""

from __future__ import annotations

from gateway.request.events.chunk import read_chunk

# Bytes of one SSE line the counter keeps while it is unended: a line past it (one tier event
# of many MB without a line break) is read by its head only, never joined whole per chunk.
MAX_LINE = 1 << 20


class SSECounter:
    """Counts a relayed SSE answer's output tokens (usage when present, else choice events)."""

    def __init__(self) -> None:
        self._partial = b""
        self.events = 0
        self.usage_tokens: int | None = None
        self.prompt_tokens: int | None = None  # the tier's count, from its usage event
        self.completed = False  # the tier's stream ended normally
        self.failure: int | None = None  # status of the error that ended it early

    @property
    def status(self) -> int:
        """The stream's outcome as an HTTP status: 200, the failure's, or 499 (client left)."""
        return self.failure or (200 if self.completed else 499)

    def feed(self, chunk: bytes) -> None:
        """Relayed bytes, cut anywhere. Read line by line (SSE's CRLF, LF or CR), not event by
        event: a line still going on keeps a bounded head, however large its event."""
        cr = b"\r" in chunk  # vLLM ends lines with LF alone: the usual case, read by split
        end = max(chunk.rfind(b"\n"), chunk.rfind(b"\r")) if cr else chunk.rfind(b"\n")
        if end < 0:  # a line still going on: its head is kept, bounded (a usage event is small)
            room = MAX_LINE - len(self._partial)
            if room > 0:
                self._partial += chunk[:room]
            return
        text = self._partial + chunk[:end]  # what is kept never holds a line ending
        lines = text.splitlines() if cr else text.split(b"\n")
        self._partial = chunk[end + 1 : end + 1 + MAX_LINE]
        for line in lines:
            if line.startswith(b"data:") and b'"choices"' in line:
                self._event(line[5:].strip())

    def _event(self, data: bytes) -> None:
        if b'"usage":{' in data.replace(b" ", b""):  # a tier's malformed usage: not counted
            prompt, completion = read_chunk(data, chat=True).usage_tokens
            if completion is not None:
                self.usage_tokens = completion
            if prompt is not None:
                self.prompt_tokens = prompt
        if b'"choices":[]' not in data.replace(b" ", b""):
            self.events += 1

    @property
    def tokens(self) -> int:
        """Usage's completion tokens if seen, else one per event but the final (empty) one."""
        return self.usage_tokens if self.usage_tokens is not None else max(self.events - 1, 0)
