"""The routing policy's ``escalation`` section: which streamed answers are watched for
degeneration (gateway/request/stream/degeneration.py) and continued on the next tier of their chain
when one degenerates (gateway/request/stream/stream_watch.py). Off while ``tiers`` is empty."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pydantic import Field

from common.class_categories import CLASS_NAMES, ClassName
from common.operator_yaml import Section
from gateway.policy.classes import PositiveInt


def _all_classes() -> list[ClassName]:
    return list(CLASS_NAMES)


class LoopRule(Section):
    """A loop: a unit of at most ``max_period`` characters repeated ``min_repeats`` times and
    covering ``min_chars`` characters at the end of the answer."""

    max_period: PositiveInt = 40
    min_repeats: int = Field(default=4, ge=2)
    min_chars: PositiveInt = 40


class ScriptsRule(Section):
    """Garbage: letters of more than ``max_scripts`` writing systems in ``window_chars``."""

    window_chars: PositiveInt = 32
    max_scripts: PositiveInt = 2


class LogprobsRule(Section):
    """Low confidence: the mean logprob of the last ``window_tokens`` tokens under
    ``min_mean``; only answers whose client asked for logprobs carry them."""

    window_tokens: PositiveInt = 16
    min_mean: float = Field(default=-4.0, lt=0)


class EscalationGuard(Section):
    """The live guard over escalations: a tier whose watched streams of a class escalated more
    than ``max_rate`` of the last ``window`` (at least ``min_samples``) is withheld from the
    class until an operator restores it. No ``max_rate``: off."""

    window: PositiveInt = 50
    min_samples: PositiveInt = 20
    max_rate: float | None = Field(default=None, ge=0, lt=1)
    # One API key's (or, without keys, one client address's) escalated streams count at most
    # max(1, max_rate x min_samples) in a window, so no one tenant alone can withhold a tier;
    # false: every stream counts alike.
    per_key: bool = True


class EscalationPolicy(Section):
    """See policies/routing.yaml for each field."""

    tiers: list[str] = Field(default_factory=list)
    classes: list[ClassName] = Field(default_factory=_all_classes)
    holdback_chars: int = Field(default=48, ge=0)
    loop: LoopRule | None = Field(default_factory=LoopRule)
    scripts: ScriptsRule | None = Field(default_factory=ScriptsRule)
    logprobs: LogprobsRule | None = None
    guard: EscalationGuard = Field(default_factory=EscalationGuard)

    def watches(self, tier: str, cls: str) -> bool:
        """Whether a ``cls`` answer streamed by ``tier`` is watched."""
        return tier in self.tiers and cls in self.classes


def escalation_problems(
    policy: EscalationPolicy, tiers: Sequence[str]
) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """Every watched tier must be declared."""
    declared = ", ".join(tiers)
    for i, name in enumerate(policy.tiers):
        if name not in tiers:
            yield ("escalation", "tiers", i), f"unknown tier {name} (tiers: {declared})"
