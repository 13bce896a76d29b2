"""How a request's tiers are asked its body: a stream asked with usage, a whole answer asked as
a stream the gateway assembles, or the body as the client sent it. Pure; decided once, into the
request value (gateway/request/route/decided.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.request.completions.body import wants_stream
from gateway.request.events.stream_usage import asking_usage
from gateway.request.kind import Kind
from gateway.request.stream.assemble import as_stream, assemblable
from gateway.request.stream.continuation import unresumable


def tier_body(
    body: Mapping[str, Any], kind: Kind, assembles: bool
) -> tuple[Mapping[str, Any], bool, bool]:
    """How the tiers are asked ``body``: the body they are sent, whether the gateway assembles
    a whole answer from a stream, and whether the client asked a stream's usage itself.

    A whole answer asked as a stream (``assembles``: failover.whole_answers: continue) is
    assembled by the gateway, and continued on the next tier when its own fails midway, as a
    stream is. A stream that can be continued asks its tier for usage, which ends the answer
    with the prompt's tokens as the tier counted them: nothing to count after it
    (gateway/request/events/stream_usage.py)."""
    if assembles and not wants_stream(body) and assemblable(body, kind):
        return as_stream(body), True, True
    if wants_stream(body) and unresumable(body, kind) is None:
        with_usage = asking_usage(body)
        if with_usage is not None:
            return with_usage, False, False
    return body, False, True
