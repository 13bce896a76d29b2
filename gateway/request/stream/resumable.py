"""Relaying a stream that can be continued on another tier (its request has a ``Resumer``).

Unlike the plain relay (gateway/request/stream/relay.py ``relay_sse``), only complete SSE events are
forwarded (gateway/request/events/sse.py ``EventBuffer``), and they are kept (``SentEvents``: a long
answer's older events folded into their text and counts, so its memory stays bounded by its
text): when the tier fails (its connection breaks, or it sends an error event of its own, as
vLLM does when its engine dies) or a watched tier's text degenerates
(gateway/request/stream/stream_watch.py), the failed response is closed first (the tier stops
generating), then the ``Resumer`` (gateway/request/stream/resume.py) opens the continuation on the
next endpoint or tier, whose events are rewritten into the same answer
(gateway/request/stream/continuation.py). A tier stream that closes cleanly with neither a
finish_reason nor ``[DONE]`` was cut mid-answer and fails the same way; one with a finish_reason
but no ``[DONE]`` is finished, and the client gets the ``[DONE]``. With nothing left to continue
on, the stream ends as the plain relay ends it: what was held back, then one SSE error event.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING

from gateway.config import TierEndpoint
from gateway.errors import APIError, sse_error_event, tier_error
from gateway.request.events.sse import DONE, EventBuffer, ends_event
from gateway.request.events.sse_counter import SSECounter
from gateway.request.kind import Kind
from gateway.request.stream.continuation import CUT, SentEvents, TierError, ends_answer, split_error
from gateway.request.stream.stream_watch import Degenerated, StreamWatch
from gateway.request.stream.taps import Taps
from gateway.request.upstream.client import Opened, UpstreamFailed, aclose_quietly, event_too_large

if TYPE_CHECKING:
    from gateway.request.stream.resume import Resumer


logger = logging.getLogger(__name__)


async def relay_resumable(
    opened: Opened, taps: Taps, resumer: Resumer
) -> AsyncGenerator[bytes, None]:
    """Yield the answer's complete events, continuing it on another tier when its own fails
    (see the module docstring)."""
    upstream, tier, response = opened.upstream, opened.tier, opened.response
    counter, on_first_byte, full = taps
    sent = SentEvents(resumer.request.kind is Kind.CHAT)  # what the client was sent
    rewrite: Callable[[bytes], bytes] | None = None
    preface = b""  # what goes before a continuation's events (the SSE comment saying so)
    while True:
        watch = resumer.watch if resumer.watches(tier) else None
        buffer = EventBuffer()  # what followed the last event boundary
        ended = False  # this tier said its answer ended (a finish_reason or [DONE])
        try:
            if preface:  # in the try: a client leaving here still closes the new response
                yield preface
            async with aclosing(upstream.iter_raw(tier, response)) as chunks:
                async for chunk in chunks:
                    if not chunk:
                        continue
                    if on_first_byte is not None:
                        on_first_byte()
                        on_first_byte = None
                    events = buffer.feed(chunk)
                    events, failure = split_error(events)
                    ended = ended or (bool(events) and ends_answer(events))
                    if rewrite is not None:
                        events = rewrite(events)
                    if watch is not None:
                        events = watch.feed(events)
                    if events:
                        sent.add(events)
                        counter.feed(events)
                        yield events
                    if failure is not None and failure.request_error:  # not continued
                        held = _ended(watch, counter, failure.status)
                        yield held + tier_error_event(tier, failure, full)
                        return
                    if failure is not None:
                        message = f"it sent an error event: {failure.message}"
                        raise UpstreamFailed(tier.name, message)
                    if watch is not None and watch.verdict is not None:
                        resumer.watched(tier, degenerated=True)
                        raise Degenerated(tier.name, watch.verdict)
                    if buffer.held > upstream.max_answer_bytes:  # the events before it went
                        raise event_too_large(tier, upstream.max_answer_bytes)
            pending = buffer.rest()
            if not (ended or ends_answer(pending)):  # closed mid-answer: a failure, not a 200
                logger.warning("tier %s: %s", tier.name, CUT)
                raise UpstreamFailed(tier.name, CUT)
            if watch is not None:
                resumer.watched(tier, degenerated=False)
            rest = (watch.flush() if watch is not None else b"") + (pending if not rewrite else b"")
            if not (sent.done or b"[DONE]" in rest):  # finished, only [DONE] missing: add it
                rest += (b"" if not rest or ends_event(rest) else b"\n\n") + DONE
            counter.feed(rest)  # held text, what followed the last event boundary, [DONE]
            yield rest
            counter.completed = True
            return
        except APIError as exc:
            await aclose_quietly(response)  # the failed tier stops before the next one starts
            going_on = await resumer.resume(tier, sent, exc)
            if going_on is None:
                held = _ended(watch, counter, exc.status)
                separator = b"" if sent.clean_end else b"\n\n"
                yield held + separator + sse_error_event(exc, full)
                return
            if resumer.watch is not None:
                resumer.watch.resume()  # what it held was never sent: forget it
        finally:
            await aclose_quietly(response)
        if going_on.tier is None or going_on.response is None:  # the answer ends here
            counter.feed(going_on.closing)
            counter.completed = True
            yield going_on.closing
            return
        tier, response, rewrite = going_on.tier, going_on.response, going_on.rewrite
        preface = going_on.closing


def _ended(watch: StreamWatch | None, counter: SSECounter, status: int | None) -> bytes:
    """A stream ending early with ``status``: what the watch held back (to send before the
    error; counted), the failure noted on the counter."""
    held = watch.flush() if watch is not None else b""
    counter.feed(held)
    counter.failure = status
    return held


def tier_error_event(tier: TierEndpoint, failure: TierError, full: bool) -> bytes:
    """A tier's own error event ending a stream, then ``[DONE]``: as the tier sent it with
    ``full`` detail, otherwise the gateway's error for it (gateway/errors.py ``tier_error``;
    the tier's text is logged, info)."""
    if full:
        return failure.event + DONE
    logger.info("tier %s sent an error event: %s", tier.name, failure.message)
    return sse_error_event(tier_error(failure.status or 502, failure.message), full=False)
