"""One request's bookkeeping, from arrival to its last byte: spans, metrics and in-flight count.

An ``Exchange`` is opened when a completion request is admitted. Its request span is the
server span it is handed (gateway/server_span.py: one span per HTTP request, so the route's
attributes land on it and no second span is made per request; the server span's middleware
ends it), or, handed none, a ``gateway.request`` span of its own that it ends; the children it
starts (``child``) are its own. It is finished once, in ``_finish``, when its answer is complete:

- by leaving its ``async with`` block (the handler), with the outcome recorded there
  (``set_outcome``) or the exception that left the block (``APIError``: its status and code;
  anything else: 500 ``internal_error``);
- or, once handed to a streamed answer (``hand_to_stream``), when that stream ends, however it
  ends (``stream_ended``); once handed to a whole answer (``hand_to_answer``), when it has been
  sent (``answer_sent``). The block then leaves it open unless an exception left it.

Finishing records the Prometheus series (gateway/metrics.py), ends the children, sets the
request span's attributes (gateway/telemetry.py; the outcome as ``gateway.response.status_code``,
which differs from the HTTP status when a stream fails or its client leaves), ends that span if
it is its own, hands the answer to ``observer`` (the live figures,
gateway/control/live_figures.py), releases the tier's in-flight slot in the shared state
(gateway/shared/state.py) and calls ``on_finish`` (the admission slot).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import anyio
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from gateway.control.live_figures import Answered
from gateway.errors import APIError
from gateway.metrics import GatewayMetrics
from gateway.request_log import RequestLog, RequestRecord
from gateway.shared.state import SharedState
from gateway.telemetry import (
    ATTR_CLASS,
    ATTR_FALLBACKS,
    ATTR_INPUT_TOKENS,
    ATTR_OUTCOME,
    ATTR_OUTPUT_TOKENS,
    ATTR_P_PRECISE,
    ATTR_REASON,
    ATTR_TIER,
    ATTR_TTFT,
)

logger = logging.getLogger(__name__)

NONE = "none"
REQUEST_SPAN = "gateway.request"


class Exchange:
    """Bookkeeping of one request (see the module docstring)."""

    def __init__(
        self,
        tracer: Tracer,
        metrics: GatewayMetrics,
        shared: SharedState,
        path: str,
        *,
        on_finish: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        log: RequestLog | None = None,
        span: Span | None = None,
        observer: Callable[[Answered], None] | None = None,
    ) -> None:
        self.metrics, self.shared, self.clock, self.log = metrics, shared, clock, log
        self.path = path
        # ``span``: the server span to annotate (its owner ends it); otherwise one of its own.
        self.owns_span = span is None
        self.span: Span = (
            tracer.start_span(REQUEST_SPAN, attributes={"url.path": path}) if span is None else span
        )
        self.started = clock()
        self.cls, self.reason, self.tier = NONE, "", NONE
        self.input_tokens: int | None = None
        # Set when the plan took a bound for the prompt's tokens: the exact count, taken when
        # the exchange finishes (after the answer, off its path) unless the tier's usage came.
        self.count_input: Callable[[], int] | None = None
        self.p_precise: float | None = None  # the classifier model's probability
        self.output_tokens: int | None = None
        self.ttft: float | None = None
        self.fallbacks = 0
        # For the live figures (``observer``, gateway/control/live_figures.py): when and how
        # often it was sent to a tier, that tier's load then, the endpoint that answered.
        self.observer = observer
        self.acquisitions, self.sent, self.load = 0, 0.0, 0
        self.endpoint: str | None = None
        self.holds_slot = False
        self.on_finish = on_finish
        self.status: int = 500  # the outcome until one is recorded
        self.error: str | None = "internal_error"
        self.handed_over = False  # to a stream or a whole answer, which finishes it
        self.finished = False
        self._tracer = tracer
        self._children: list[Span] = []  # ended before the request's span

    async def __aenter__(self) -> Exchange:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(exc, APIError):
            self.set_outcome(exc.status, exc.code or "error")
        elif exc is not None:
            self.set_outcome(500, "internal_error")
        if exc is not None and not self.owns_span:
            # Its own span records it through use_span (gateway/request/completions/proxy.py); the
            # server span would only see its type, and not at all when an APIError becomes an
            # answer.
            self.span.record_exception(exc)
        # An answer that will not be sent (an exception left the block) cannot finish it.
        if exc is not None or not self.handed_over:
            await self._finish()

    def child(self, name: str) -> Span:
        """Start a child span of the request's; it ends, tagged with the tier, at the finish."""
        span = self._tracer.start_span(name, context=trace.set_span_in_context(self.span))
        self._children.append(span)
        return span

    async def acquire(self, tier: str) -> None:
        """The request is now in flight on ``tier``."""
        await self.release()
        self.tier = tier
        self.acquisitions += 1
        self.sent = self.clock() - self.started
        # Held before the await: begin() counts locally first, so a cancellation during its
        # Redis write must still release the slot.
        self.holds_slot = True
        await self.shared.begin(tier)
        self.load = self.shared.local_in_flight(tier)

    async def release(self) -> None:
        if self.holds_slot:
            self.holds_slot = False
            await self.shared.end(self.tier)

    def fell_back(self, tier: str, reason: str) -> None:
        self.fallbacks += 1
        self.metrics.fallback(tier, reason)

    def resumed(self, failed: str, tier: str, generated: int, error: str) -> None:
        """The stream went on on ``tier`` after ``failed`` broke off
        (gateway/request/stream/resume.py)."""
        self.metrics.resumed(failed, tier)
        self.span.add_event(
            "gateway.stream.resumed",
            {"from_tier": failed, "to_tier": tier, "tokens_before": generated, "error": error},
        )

    def escalated(self, failed: str, tier: str, kind: str, detail: str, generated: int) -> None:
        """The stream went on on ``tier`` after ``failed``'s answer degenerated."""
        self.metrics.escalated(failed, tier, self.cls, kind)
        self.span.add_event(
            "gateway.stream.escalated",
            {"from_tier": failed, "to_tier": tier, "kind": kind, "detail": detail,
             "tokens_before": generated},
        )  # fmt: skip

    def first_byte(self) -> None:
        if self.ttft is None:
            self.ttft = self.clock() - self.started

    def set_outcome(self, status: int, error: str | None = None) -> None:
        """What the finish records. ``error`` names why the gateway refused the request
        (counted in ``gateway_rejections_total``); answers the tier gave, streams cut short and
        clients that left are counted by status only."""
        self.status, self.error = status, error

    def hand_to_stream(self) -> None:
        """A streamed answer now owns the exchange: ``stream_ended`` finishes it."""
        self.handed_over = True

    def hand_to_answer(self) -> None:
        """A whole answer being sent now owns the exchange: ``answer_sent`` finishes it, so the
        bookkeeping comes after the answer is on its way, as it does for a stream."""
        self.handed_over = True

    async def answer_sent(self) -> None:
        """The whole answer was sent (or sending it failed): finish."""
        await self._finish()

    async def stream_ended(self, status: int, output_tokens: int) -> None:
        """The streamed answer is over (done, failed or the client left): finish. The tier's
        prompt count, when it sent one, was taken before (stream/resume.py ``use_tier_count``)."""
        self.output_tokens = output_tokens
        self.set_outcome(status)
        await self._finish()

    async def _finish(self) -> None:
        """Record the outcome once; later calls do nothing."""
        if self.finished:
            return
        self.finished = True
        if self.on_finish is not None:
            self.on_finish()
        try:
            duration = self.clock() - self.started
            count, self.count_input = self.count_input, None
            if count is not None:
                try:
                    self.input_tokens = count()
                except Exception:  # the answer is out: record the request whatever this does
                    logger.warning("counting a prompt after its answer failed", exc_info=True)
                    self.input_tokens = None
            self.metrics.observe_request(
                self.cls,
                self.tier,
                str(self.status),
                duration,
                self.ttft,
                self.input_tokens,
                self.output_tokens,
            )
            if self.error is not None:
                self.metrics.reject(self.error)
            self._annotate(self.status, self.error)
            if self.log is not None and self.log.wants(self.status):
                self.log.record(self._record(duration))
            for child in self._children:
                child.set_attribute(ATTR_TIER, self.tier)
                child.end()
            if self.owns_span:
                self.span.end()
            if self.observer is not None and self.acquisitions:
                self.observer(self._answered(duration))
        finally:
            # Last, whatever the bookkeeping did: the only step that may wait (a Redis write
            # when shared_flush_interval is 0), so the metrics and spans above are recorded
            # before anything else can run.
            if self.holds_slot:
                # shielded: it may run in a scope the client's leaving cancels
                with anyio.CancelScope(shield=True):
                    await self.release()

    def _answered(self, duration: float) -> Answered:
        return Answered(
            self.tier, self.status, duration, self.ttft, self.sent, self.input_tokens,
            self.output_tokens, self.load, self.acquisitions, self.fallbacks, self.endpoint,
        )  # fmt: skip

    def _record(self, duration: float) -> RequestRecord:
        return RequestRecord(
            path=self.path,
            status=self.status,
            cls=self.cls,
            tier=self.tier,
            reason=self.reason,
            duration_ms=round(duration * 1000, 3),
            ttft_ms=None if self.ttft is None else round(self.ttft * 1000, 3),
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            fallbacks=self.fallbacks,
            error=self.error,
            trace_id=format(self.span.get_span_context().trace_id, "032x"),
        )

    def _annotate(self, status: int, error: str | None) -> None:
        attributes: dict[str, Any] = {
            ATTR_CLASS: self.cls,
            ATTR_TIER: self.tier,
            ATTR_REASON: self.reason,
            ATTR_FALLBACKS: self.fallbacks,
            ATTR_OUTCOME: status,
        }
        if self.owns_span:  # a server span has the status its answer was sent with
            attributes["http.response.status_code"] = status
        if self.input_tokens is not None:
            attributes[ATTR_INPUT_TOKENS] = self.input_tokens
        if self.output_tokens is not None:
            attributes[ATTR_OUTPUT_TOKENS] = self.output_tokens
        if self.p_precise is not None:
            attributes[ATTR_P_PRECISE] = self.p_precise
        if self.ttft is not None:
            attributes[ATTR_TTFT] = round(self.ttft * 1000, 3)
        self.span.set_attributes(attributes)
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR, error or f"HTTP {status}"))
