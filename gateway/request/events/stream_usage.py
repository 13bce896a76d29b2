"""Every continuable stream asks its tier for usage; the client gets it only if it asked.

A streamed answer's prompt tokens used to be counted by the gateway's tokenizer after the
answer (for the metrics, the request log and the span): ~70 µs on the request path of a short
prompt, before the next request of the connection is read. vLLM counts them anyway: asked
with ``stream_options.include_usage``, it ends the stream with one event whose ``choices`` is
empty and whose ``usage`` has the prompt's and the answer's tokens (vLLM leaves ``usage`` out
of every other event). So a stream that can be continued (its events pass whole through
gateway/request/stream/resumable.py) and whose client set no ``stream_options`` is asked with
``include_usage``; the counter (``SSECounter``) reads that event, and ``without_usage`` drops
it from what the client is sent. A client that set ``stream_options`` is asked as it asked.

One difference stays: vLLM puts a configured ``system_fingerprint`` on the usage event
instead of the last choice's event when usage is asked; the tiers this project starts set
none.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any

from gateway.request.events.sse import payload, split_events

USAGE_OPTIONS = {"include_usage": True}


def asking_usage(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``body`` asking its tier for the stream's usage, or None when the client chose the
    stream's options itself (it gets what it asked)."""
    if "stream_options" in body:
        return None
    return {**body, "stream_options": USAGE_OPTIONS}


def is_usage_event(event: bytes) -> bool:
    """Whether one SSE event (no separator) is a usage-only event: no choices, a usage. Its
    data is read (gateway/request/events/sse.py) but not decoded: inside a JSON string a quote is
    escaped, so ``"choices":[]`` and ``"usage"`` there are only ever keys (the counter decodes
    the event anyway; a second decode was 1.5 % of a streamed request's instructions)."""
    if b'"usage"' not in event:  # the usual event
        return False
    data = payload(event)
    return data is not None and b'"usage"' in data and b'"choices":[]' in data.replace(b" ", b"")


def drop_usage_events(block: bytes) -> bytes:
    """``block`` (SSE events, each ended by a blank line in any framing; the last may be
    unended) without its usage events, the other events as they were."""
    if b'"usage"' not in block:
        return block
    return b"".join(event + end for event, end in split_events(block) if not is_usage_event(event))


async def without_usage(blocks: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """The blocks of a resumable relay, without the usage events the client did not ask for."""
    async with aclosing(blocks):
        async for block in blocks:
            kept = drop_usage_events(block)
            if kept:
                yield kept
