"""The request log: one JSON line for every request that failed on the gateway's side (5xx) and
for a sample of the rest, in place of uvicorn's access log (a line per request).

``should_log`` is the decision (pure); ``RequestLog.record`` draws and writes to the
``gateway.requests`` logger at INFO (5xx at WARNING). A line carries what the trace has for
the request (path, status, class, tier, reason, duration, time to first byte, tokens,
fallbacks, the refusal's code) and its trace id, so a sampled line leads to its spans.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass

logger = logging.getLogger("gateway.requests")


@dataclass(frozen=True)
class RequestRecord:
    """One finished request, as the log writes it."""

    path: str
    status: int
    cls: str
    tier: str
    reason: str
    duration_ms: float
    ttft_ms: float | None
    input_tokens: int | None
    output_tokens: int | None
    fallbacks: int
    error: str | None
    trace_id: str


def should_log(status: int, sample: float, draw: float) -> bool:
    """Every 5xx; other requests when ``draw`` (uniform in [0, 1)) falls under ``sample``."""
    return status >= 500 or draw < sample


class RequestLog:
    """Writes ``RequestRecord`` lines for a share ``sample`` of requests, and every 5xx."""

    def __init__(self, sample: float, draw: Callable[[], float] = random.random) -> None:
        self.sample, self.draw = sample, draw

    def wants(self, status: int) -> bool:
        """Whether a request that ended with ``status`` is logged (draws once)."""
        return should_log(status, self.sample, self.draw() if status < 500 else 0.0)

    def record(self, record: RequestRecord) -> None:
        level = logging.WARNING if record.status >= 500 else logging.INFO
        if logger.isEnabledFor(level):
            logger.log(level, "%s", json.dumps(asdict(record), separators=(",", ":")))
