"""One completion request, parsed and decided once: the value every step after planning reads.

gateway/request/completions/proxy.py reads the body, assesses and plans it
(gateway/request/route/plan.py), then makes one ``CompletionRequest`` (how its tiers are asked:
gateway/request/completions/tier_body.py): its kind, the client's body, the plan, the chain of
endpoints, what each tier is asked (headers, body, first-byte bound) and how (a stream or not, usage
asked by the gateway, a whole answer assembled), who asked and how much it is told. Opening the
chain (gateway/request/route/chain.py), the answers (gateway/request/stream/relay.py,
gateway/request/completions/whole.py), the continuation of a failed stream
(gateway/request/stream/resume.py) and shadow sampling read it; none decides any of it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from gateway.config import TierEndpoint
from gateway.policy.escalation import EscalationPolicy
from gateway.request.kind import Kind
from gateway.request.route.plan import Plan
from gateway.request.tokens.prompt_count import PromptCounter


class CompletionRequest(NamedTuple):
    """A completion request as decided (see the module docstring); what every tier of its
    chain is asked (gateway/request/route/chain.py ``Asked``). Immutable as a frozen dataclass is,
    made for a quarter of the instructions (one is made for every request;
    benchmarks/gateway_instructions.py counts them)."""

    kind: Kind  # chat or completions
    body: Mapping[str, Any]  # as the client sent it (checked and screened)
    plan: Plan  # class, reason, the tiers' names and each one's max_tokens
    chain: list[list[TierEndpoint]]  # each tier of the plan as its endpoints, in order to try
    headers: Mapping[str, str]  # sent to every tier (the client's, with the trace context)
    tier_body: Mapping[str, Any]  # the body as tiers are asked it, before each one's max_tokens
    streamed: bool  # the tiers are asked for a stream
    first_byte: float  # seconds a tier may take to its first byte (inf: a whole answer)
    assembling: bool  # a whole answer asked as a stream, assembled by the gateway
    usage_asked: bool  # False: the gateway asked a stream's usage, which the client is not sent
    full: bool  # the client is told everything (gateway/errors.py)
    who: str | None  # who asked, as the live guard counts askers
    model: str  # the served model's name (an answer's events the gateway writes carry it)
    counter: PromptCounter  # counts the text a continuation resends
    escalation: EscalationPolicy  # which streams are watched, and where they go on

    @property
    def cls(self) -> str:
        return self.plan.cls

    @property
    def max_tokens_field(self) -> str:
        return self.plan.max_tokens_field

    def body_for(self, tier: str) -> Mapping[str, Any]:
        """The body to send ``tier``: ``tier_body`` with its ``max_tokens`` as planned."""
        return self.plan.body_for(tier, self.tier_body)
