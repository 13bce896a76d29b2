"""What a relay reports as the tier's bytes pass: one value for the three that travel together.

Both relays (gateway/request/stream/relay.py ``relay_sse``, gateway/request/stream/resumable.py
``relay_resumable``) take a ``Taps``: the counter that reads the answer's tokens and outcome
(gateway/request/events/sse_counter.py), the exchange's first-byte mark (its TTFT) and whether a
failure mid-stream tells the client everything (``full``, gateway/errors.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from gateway.request.events.sse_counter import SSECounter


class Taps(NamedTuple):
    """See the module docstring."""

    counter: SSECounter
    on_first_byte: Callable[[], None] | None = None  # called once, at the first bytes
    full: bool = True
