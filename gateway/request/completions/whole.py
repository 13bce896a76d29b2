"""A whole answer asked of its tier as a stream and assembled (policy ``failover.whole_answers:
continue``; gateway/request/stream/assemble.py): relayed as a stream that can be continued
(gateway/request/stream/resumable.py), then sent whole. Which tiers it went on on is the
``x-route-continued`` header (the tier that began it is ``x-route-tier``)."""

from __future__ import annotations

from contextlib import aclosing

from gateway.request.events.answer_usage import MalformedAnswer, answer_usage
from gateway.request.events.sse_counter import SSECounter
from gateway.request.kind import Kind
from gateway.request.stream.assemble import Assembler
from gateway.request.stream.relay import Reply, WholeAnswer, relay_sse
from gateway.request.stream.resumable import relay_resumable
from gateway.request.stream.resume import Resumer, use_tier_count
from gateway.request.stream.taps import Taps
from gateway.request.upstream.client import Opened

CONTINUED_HEADER = "x-route-continued"


async def assembled_answer(
    opened: Opened, resumer: Resumer | None, reply: Reply, kind: Kind
) -> tuple[bytes | None, WholeAnswer]:
    """The whole answer (which finishes the reply's exchange once sent), and its body when
    one tier wrote all of it (for shadow sampling: an answer continued elsewhere is not that
    tier's); None for an error or a continued answer. Without a ``resumer`` it is not
    continued."""
    exchange, full = reply.exchange, reply.full
    counter, assembler = SSECounter(), Assembler(kind is Kind.CHAT)
    if resumer is not None:
        relay = relay_resumable(opened, Taps(counter, None, full), resumer)
    else:
        relay = relay_sse(opened, Taps(counter, None, full))
    async with aclosing(relay) as chunks:
        async for chunk in chunks:
            assembler.feed(chunk)
    answer = assembler.result(counter.failure)
    if answer.status == 200:
        try:  # the gateway assembled it: a JSON object
            prompt_tokens, exchange.output_tokens = answer_usage(answer.body)
        except MalformedAnswer:  # a usage event that was not an object: no count
            prompt_tokens = None
        use_tier_count(exchange, prompt_tokens, resumer)
    exchange.set_outcome(answer.status)
    sent_headers = dict(reply.headers)
    continued = resumer.continued_on if resumer is not None else []
    if continued:
        sent_headers[CONTINUED_HEADER] = ",".join(continued)
    whole = WholeAnswer(answer.body, answer.status, "application/json", sent_headers, exchange)
    return (answer.body if answer.status == 200 and not continued else None), whole
