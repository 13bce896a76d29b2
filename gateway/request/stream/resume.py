"""Opening the continuation of a streamed answer whose tier failed mid-stream.

A ``Resumer`` is made for each streamed request that can be continued
(gateway/request/stream/continuation.py ``unresumable``). When the answering endpoint fails after
the client has had part of the answer, the relay (gateway/request/stream/relay.py) hands it the
events sent so far; it opens the same request, continued from that text, on the endpoints after the
failed one in the request's chain (the rest of its tier's pool, then the next tiers), as
``open_chain`` opens a request, and returns the continuation: the endpoint, its response and
the rewriter of its events. The switch is counted (``gateway_stream_resumes_total``), is an
event on the request's span and an SSE comment line in the stream (clients ignore comments).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.config import TierEndpoint
from gateway.errors import APIError
from gateway.request.events.sse import DONE
from gateway.request.exchange import Exchange
from gateway.request.kind import Kind
from gateway.request.route.chain import open_chain
from gateway.request.route.decided import CompletionRequest
from gateway.request.stream.continuation import (
    Rewriter,
    Sent,
    SentEvents,
    continuation_body,
    length_ending,
    unresumable,
    used_up,
)
from gateway.request.stream.stream_watch import Degenerated, StreamWatch, watch_for
from gateway.request.tokens.prompt_count import ByteCounter
from gateway.request.upstream.client import Upstream, aclose_quietly

logger = logging.getLogger(__name__)

Chain = Sequence[Sequence[TierEndpoint]]


@dataclass(frozen=True)
class Continuation:
    """How the stream goes on: a tier's response and its rewriter, or closing events only."""

    tier: TierEndpoint | None = None
    response: httpx.Response | None = None
    rewrite: Callable[[bytes], bytes] | None = None
    closing: bytes = b""  # sent before anything else: a comment, or the answer's end


@dataclass(frozen=True)
class Continued:
    """A request continued from what was ``sent``: asked as it was (gateway/request/route/chain.py
    ``Asked``), each tier's body asking it to go on (``budget_cut``: the tokens its budget
    loses)."""

    request: CompletionRequest
    sent: Sent
    budget_cut: int

    @property
    def kind(self) -> Kind:
        return self.request.kind

    @property
    def headers(self) -> Mapping[str, str]:
        return self.request.headers

    @property
    def first_byte(self) -> float:
        return self.request.first_byte

    def body_for(self, tier: str) -> dict[str, Any]:
        request = self.request
        return continuation_body(request.body_for(tier), request.kind, self.sent,
                                 self.budget_cut, request.max_tokens_field)  # fmt: skip


def rest_of_chain(chain: Chain, failed: TierEndpoint) -> list[list[TierEndpoint]]:
    """The endpoints to try after ``failed``: the rest of its tier's pool, then later tiers."""
    for i, endpoints in enumerate(chain):
        for j, endpoint in enumerate(endpoints):
            if endpoint is failed or endpoint == failed:
                return [list(endpoints[j + 1 :]), *(list(e) for e in chain[i + 1 :])]
    return []


class Resumer:
    """Continues one streamed request on the rest of its chain (see the module docstring)."""

    def __init__(
        self,
        upstream: Upstream,
        request: CompletionRequest,
        exchange: Exchange,
        on_watched: Callable[[str, bool], None] | None = None,
    ) -> None:
        """``request``: its chain, what each tier is asked, the counter of a resent text and
        the escalation policy."""
        self.upstream, self.exchange = upstream, exchange
        self.chain: Chain = request.chain
        self.request = request
        counter, escalation = request.counter, request.escalation
        self.count_text = counter.count_text
        self.exact = not isinstance(counter, ByteCounter)  # a tokenizer's count, not a bound
        self.escalation = escalation
        self.on_watched = on_watched  # (tier, degenerated) of each watched stream: the guard
        self.watch: StreamWatch | None = None
        self.continued_on: list[str] = []  # the tiers the answer went on on, in order
        # The answer was ended or continued by the gateway: a usage event in it is the
        # gateway's sum (or its own count), not one tier's count of the prompt.
        self.resumed = False
        if escalation is not None and escalation.tiers and request.cls in escalation.classes:
            chat = request.kind is Kind.CHAT
            self.watch = watch_for(escalation, escalation.holdback_chars, chat)

    def watched(self, tier: TierEndpoint, degenerated: bool) -> None:
        """A watched stream of ``tier`` finished, or degenerated (the live guard hears it)."""
        if self.on_watched is not None:
            self.on_watched(tier.name, degenerated)

    def watches(self, tier: TierEndpoint) -> bool:
        """Whether ``tier``'s stream is watched: the policy says so and a later tier of the
        chain could continue it."""
        if self.watch is None or self.escalation is None:
            return False
        return self.escalation.watches(tier.name, self.request.cls) and any(
            rest_of_chain(self.chain, tier)[1:]
        )

    async def resume(
        self, failed: TierEndpoint, sent_events: SentEvents, error: APIError
    ) -> Continuation | None:
        """The stream's continuation after ``failed`` broke off with ``error``; None when it
        cannot go on (the relay then ends it with the error event, as before)."""
        request = self.request
        chat = request.kind is Kind.CHAT
        sent = sent_events.read()
        self.resumed = True
        if sent.why_not is not None:
            logger.info("stream on %s not continued: %s", failed.name, sent.why_not)
            return None
        if sent.finished:  # the answer had ended: only its [DONE] was missing
            return Continuation(closing=b"" if sent_events.done else DONE)
        # Each token event held one token or more; with a tokenizer the text's own count is
        # the better estimate when larger (several tokens an event). Without one the count is
        # the text's bytes, an upper bound: it only cuts the next tier's budget (it reads that
        # many more tokens of prompt: its context must hold them).
        resent = self.count_text(sent.text) if sent.text else 0
        generated = max(sent.events, resent) if self.exact else sent.events
        budget_cut = max(sent.events, resent)
        if used_up(request.body_for(failed.name), generated, request.max_tokens_field):
            self._record(failed, None, generated, error)
            usage = self._usage(failed, generated)
            return Continuation(closing=length_ending(sent, chat, request.model, usage))
        rest = rest_of_chain(self.chain, failed)
        verdict = error.verdict if isinstance(error, Degenerated) else None
        if verdict is not None:  # the same precision would degenerate alike: the next tier
            rest = rest[1:]

        continued = Continued(request, sent, budget_cut)
        while any(rest):
            try:
                tier, response = await open_chain(self.upstream, rest, continued, self.exchange)
            except APIError:  # nothing answered: the request stays the failed tier's
                self.exchange.tier = failed.name
                return None
            if response.status_code == 200:
                self._record(failed, tier, generated, error)
                why = "failed" if verdict is None else f"degenerated ({verdict.kind})"
                comment = f": answer continued on tier {tier.name} after tier {failed.name} {why}"
                rewrite = Rewriter(sent, chat, generated, resent if self.exact else generated)
                return Continuation(tier, response, rewrite, comment.encode() + b"\n\n")
            logger.warning(
                "continuing a stream on %s: it answered HTTP %s", tier.name, response.status_code
            )
            await aclose_quietly(response)
            rest = rest_of_chain(rest, tier)
        return None

    def _usage(self, failed: TierEndpoint, generated: int) -> dict[str, int] | None:
        """The usage of an answer ended at its length, when the request asked for usage: the
        tokens generated, the prompt's as the gateway counted it (its tier's count is lost)."""
        options = self.request.body_for(failed.name).get("stream_options")
        if not isinstance(options, dict) or not options.get("include_usage"):
            return None
        prompt = self.exchange.input_tokens or 0
        return {"prompt_tokens": prompt, "completion_tokens": generated,
                "total_tokens": prompt + generated}  # fmt: skip

    def _record(
        self, failed: TierEndpoint, tier: TierEndpoint | None, generated: int, error: APIError
    ) -> None:
        to = tier.name if tier is not None else "none"
        if tier is not None:
            self.continued_on.append(tier.name)
        if isinstance(error, Degenerated):
            verdict = error.verdict
            self.exchange.escalated(failed.name, to, verdict.kind, verdict.detail, generated)
        else:
            self.exchange.resumed(failed.name, to, generated, error.code or "error")


def use_tier_count(exchange: Exchange, prompt_tokens: int | None, resumer: Resumer | None) -> None:
    """Take the answering tier's count of the prompt (its answer's usage) as the request's,
    unless the answer was continued or ended by the gateway (``resumer.resumed``: its usage is
    then the gateway's sum, or its own count): the gateway then counts the prompt itself when
    the exchange finishes. Nothing to take without a count."""
    if prompt_tokens and (resumer is None or not resumer.resumed):
        exchange.input_tokens, exchange.count_input = prompt_tokens, None


def stream_resumer(
    upstream: Upstream,
    request: CompletionRequest,
    exchange: Exchange,
    on_watched: Callable[[str, bool], None] | None = None,
) -> Resumer | None:
    """The resumer of a streamed request (its tiers asked a stream), or None when its answer
    could not be continued."""
    if unresumable(request.tier_body, request.kind) is not None:
        return None
    return Resumer(upstream, request, exchange, on_watched)
