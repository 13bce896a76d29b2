"""A whole answer asked of its tier as a stream and assembled (policy ``failover.whole_answers:
continue``; gateway/request/assemble.py): relayed as a stream that can be continued
(gateway/request/resumable.py), then sent whole. Which tiers it went on on is the
``x-route-continued`` header (the tier that began it is ``x-route-tier``)."""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from gateway.config import TierEndpoint
from gateway.request.assemble import assemble
from gateway.request.exchange import Exchange, usage_tokens
from gateway.request.prompt_count import CHAT
from gateway.request.relay import WholeAnswer
from gateway.request.resumable import read_resumable
from gateway.request.resume import Resumer
from gateway.request.upstream import Upstream

CONTINUED_HEADER = "x-route-continued"


async def assembled_answer(
    upstream: Upstream,
    tier: TierEndpoint,
    response: httpx.Response,
    resumer: Resumer,
    headers: Mapping[str, str],
    exchange: Exchange,
    full: bool,
    path: str,
) -> tuple[bytes | None, WholeAnswer]:
    """The whole answer (which finishes ``exchange`` once sent), and its body when it is one
    (for shadow sampling), None for an error."""
    events, counter = await read_resumable(upstream, tier, response, full, resumer)
    answer = assemble(events, path == CHAT, counter.failure)
    if answer.status == 200:
        prompt_tokens, exchange.output_tokens = usage_tokens(answer.body)
        if prompt_tokens:  # the tiers' own count: nothing left to count
            exchange.input_tokens, exchange.count_input = prompt_tokens, None
    exchange.set_outcome(answer.status)
    sent_headers = dict(headers)
    if resumer.continued_on:
        sent_headers[CONTINUED_HEADER] = ",".join(resumer.continued_on)
    whole = WholeAnswer(answer.body, answer.status, "application/json", sent_headers, exchange)
    return (answer.body if answer.status == 200 else None), whole
