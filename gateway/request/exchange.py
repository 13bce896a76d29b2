"""One request's bookkeeping, from arrival to its last byte: span, metrics and in-flight count.

An ``Exchange`` is created when a completion request arrives and finished exactly once, when
its answer is complete (a streamed answer finishes when the stream ends, however it ends).
Finishing records the Prometheus series (gateway/metrics.py), ends the request's span with its
attributes (gateway/telemetry.py) and releases the tier's in-flight slot in the shared state
(gateway/shared/state.py). ``SSECounter`` watches a relayed stream for the usage object vLLM sends
when asked, and otherwise counts the events that carry choices (one token each in vLLM).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from opentelemetry.trace import Span, Status, StatusCode

from gateway.metrics import GatewayMetrics
from gateway.shared.state import SharedState
from gateway.telemetry import (
    ATTR_CLASS,
    ATTR_FALLBACKS,
    ATTR_INPUT_TOKENS,
    ATTR_OUTPUT_TOKENS,
    ATTR_REASON,
    ATTR_TIER,
    ATTR_TTFT,
)

NONE = "none"


@dataclass
class Exchange:
    """Bookkeeping of one request (see the module docstring)."""

    metrics: GatewayMetrics
    shared: SharedState
    span: Span
    clock: Callable[[], float] = time.perf_counter
    started: float = field(default=0.0)
    cls: str = NONE
    reason: str = ""
    tier: str = NONE
    input_tokens: int | None = None
    output_tokens: int | None = None
    ttft: float | None = None
    fallbacks: int = 0
    holds_slot: bool = False
    children: list[Span] = field(default_factory=list)  # ended before the request's span
    on_finish: Callable[[], None] | None = None  # e.g. the admission slot's release
    finished: bool = False

    def __post_init__(self) -> None:
        self.started = self.started or self.clock()

    async def acquire(self, tier: str) -> None:
        """The request is now in flight on ``tier``."""
        await self.release()
        self.tier = tier
        # Held before the await: begin() counts locally first, so a cancellation during its
        # Redis write must still release the slot.
        self.holds_slot = True
        await self.shared.begin(tier)

    async def release(self) -> None:
        if self.holds_slot:
            self.holds_slot = False
            await self.shared.end(self.tier)

    def fell_back(self, tier: str, reason: str) -> None:
        self.fallbacks += 1
        self.metrics.fallback(tier, reason)

    def first_byte(self) -> None:
        if self.ttft is None:
            self.ttft = self.clock() - self.started

    async def finish(self, status: int, error: str | None = None) -> None:
        """Record the outcome once; later calls do nothing. ``error`` names why the gateway
        refused the request (counted in ``gateway_rejections_total``); answers the tier gave,
        streams cut short and clients that left are counted by status only."""
        if self.finished:
            return
        self.finished = True
        if self.on_finish is not None:
            self.on_finish()
        with anyio.CancelScope(shield=True):  # may run in a scope the client's leaving cancels
            await self.release()
        duration = self.clock() - self.started
        self.metrics.observe_request(
            self.cls,
            self.tier,
            str(status),
            duration,
            self.ttft,
            self.input_tokens,
            self.output_tokens,
        )
        if error is not None:
            self.metrics.reject(error)
        self._annotate(status, error)
        for child in self.children:
            child.set_attribute(ATTR_TIER, self.tier)
            child.end()
        self.span.end()

    def _annotate(self, status: int, error: str | None) -> None:
        attributes: dict[str, Any] = {
            ATTR_CLASS: self.cls,
            ATTR_TIER: self.tier,
            ATTR_REASON: self.reason,
            ATTR_FALLBACKS: self.fallbacks,
            "http.response.status_code": status,
        }
        if self.input_tokens is not None:
            attributes[ATTR_INPUT_TOKENS] = self.input_tokens
        if self.output_tokens is not None:
            attributes[ATTR_OUTPUT_TOKENS] = self.output_tokens
        if self.ttft is not None:
            attributes[ATTR_TTFT] = round(self.ttft * 1000, 3)
        self.span.set_attributes(attributes)
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR, error or f"HTTP {status}"))


class SSECounter:
    """Counts a relayed SSE answer's output tokens (usage when present, else choice events)."""

    def __init__(self) -> None:
        self._partial = b""
        self.events = 0
        self.usage_tokens: int | None = None
        self.completed = False  # the tier's stream ended normally
        self.failure: int | None = None  # status of the error that ended it early

    @property
    def status(self) -> int:
        """The stream's outcome as an HTTP status: 200, the failure's, or 499 (client left)."""
        return self.failure or (200 if self.completed else 499)

    def feed(self, chunk: bytes) -> None:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.startswith(b"data:") and b'"choices"' in line:
                self._event(line[5:].strip())

    def _event(self, data: bytes) -> None:
        if b'"usage":{' in data.replace(b" ", b""):
            try:
                usage = json.loads(data).get("usage") or {}
            except (ValueError, AttributeError):
                usage = {}
            if isinstance(usage.get("completion_tokens"), int):
                self.usage_tokens = usage["completion_tokens"]
        if b'"choices":[]' not in data.replace(b" ", b""):
            self.events += 1

    @property
    def tokens(self) -> int:
        """Usage's completion tokens if seen, else one per event but the final (empty) one."""
        return self.usage_tokens if self.usage_tokens is not None else max(self.events - 1, 0)


def usage_tokens(raw: bytes) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens from a whole JSON answer's ``usage``, when it has one."""
    try:
        usage = json.loads(raw).get("usage") or {}
    except (ValueError, AttributeError):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) else None,
        completion if isinstance(completion, int) else None,
    )
