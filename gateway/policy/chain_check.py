"""Static routes that contradict the measurements (pure): ``policy check``'s warnings.

A route without ``derive`` is served as written. Measured on this machine (``up``'s figures,
gateway/measured.py), its chain can still be wrong, and the operator should hear it:

- a tier the in-engine admission check did not admit for the class (the gateway skips it
  there, so the chain is not what it says);
- a tier whose agreement with the reference on one of the class's categories is below the
  admission floor of that category;
- an ordered chain that puts a tier before, or instead of, an admitted tier that is faster
  and at least as accurate (or as fast and more accurate): the first tier takes the traffic,
  so it would be paying more for less.

"Faster" is the ``latency`` cost of the derivation (gateway/policy/derive.py): ``ttft +
answer_tokens x tpot`` of one answer alone; accuracy is the tier's lowest agreement over the
class's categories (the reference: 1). Derived routes are not checked (the gateway orders them
from the same figures), nor tiers without figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.class_categories import CLASS_CATEGORIES, CLASS_NAMES
from common.operator_yaml import compose_yaml, line_of
from gateway.policy.derive import TierFigures
from gateway.policy.schema import PolicyError, RoutingPolicy

ANSWER_TOKENS = 128  # the answer length the latency cost assumes (derive's default)


@dataclass(frozen=True)
class ChainWarning:
    cls: str
    tier: str
    line: int  # the route's line in the policy file
    message: str

    def render(self, source: str) -> str:
        return f"{source}:{self.line}: routes.{self.cls}: warning: {self.message}"


@dataclass(frozen=True)
class _Tier:
    name: str
    quality: float
    seconds: float
    figures: TierFigures

    def describe(self) -> str:
        f = self.figures
        return (
            f"{self.name} (agreement {self.quality:.3f}; TTFT {f.ttft_s * 1000:.0f} ms, TPOT "
            f"{f.tpot_s * 1000:.1f} ms: {self.seconds:.3f} s per {ANSWER_TOKENS}-token answer)"
        )


def route_lines(text: str, source: str) -> dict[str, int]:
    """The line of each class's route in the policy's text (``routes.<class>``)."""
    root, _ = compose_yaml(text, source, PolicyError)
    return {cls: line_of(root, ("routes", cls)) for cls in CLASS_NAMES}


def _admitted(figures: TierFigures, cls: str) -> bool:
    return figures.classes is None or cls in figures.classes


def _floor_problems(figures: TierFigures, cls: str, floors: Mapping[str, float]) -> list[str]:
    out = []
    for category in CLASS_CATEGORIES.get(cls, ("chat",)):
        value, floor = figures.quality.get(category), floors.get(category)
        if value is not None and floor is not None and value < floor:
            out.append(f"agreement on {category} {value:.3f} < admission floor {floor:.2f}")
    return out


def _dominates(a: _Tier, b: _Tier) -> bool:
    return (
        a.quality >= b.quality
        and a.seconds <= b.seconds
        and (a.quality > b.quality or a.seconds < b.seconds)
    )


def _order_problem(tier: _Tier, chain: Sequence[str], candidates: Sequence[_Tier]) -> str | None:
    """``tier`` served before (or instead of) a tier that beats it, or ``None``; of several,
    the fastest is named."""
    position = chain.index(tier.name)
    better = [
        other
        for other in candidates
        if other.name != tier.name
        and _dominates(other, tier)
        # a worse tier after a better one is only its fallback: fine
        and not (other.name in chain and chain.index(other.name) < position)
    ]
    if not better:
        return None
    other = min(better, key=lambda t: (t.seconds, -t.quality))
    accurate = "more accurate" if other.quality > tier.quality else "as accurate"
    fast = "faster" if other.seconds < tier.seconds else "as fast"
    where = "later in the chain" if other.name in chain else "not in the chain"
    return (
        f"{tier.describe()} is served before {other.describe()}, {where}, which is "
        f"{fast} and {accurate} here"
    )


def check_chains(
    policy: RoutingPolicy,
    figures: Mapping[str, TierFigures],
    reference: str,
    floors: Mapping[str, float],
    lines: Mapping[str, int],
) -> list[ChainWarning]:
    """Every contradiction between the policy's static routes and ``figures`` (see above)."""
    warnings: list[ChainWarning] = []
    for cls in CLASS_NAMES:
        route = policy.routes.for_class(cls)
        if route is None or route.derive is not None:
            continue
        line = lines.get(cls, 1)
        measured: dict[str, _Tier] = {}
        for name in policy.tiers:
            got = figures.get(name)
            quality = 1.0 if name == reference else got.quality_for(cls) if got else None
            if got is not None and quality is not None:
                measured[name] = _Tier(name, quality, got.cost("latency", ANSWER_TOKENS), got)
        usable = [
            t
            for t in measured.values()
            if _admitted(t.figures, cls)
            and (t.name == reference or not _floor_problems(t.figures, cls, floors))
        ]
        for name in route.tiers:
            tier = measured.get(name)
            if tier is None:
                continue
            problems = _floor_problems(tier.figures, cls, floors) if name != reference else []
            if not _admitted(tier.figures, cls):
                problems.insert(0, f"not admitted for {cls} by the in-engine check (skipped)")
            if problems:
                text = f"tier {tier.describe()}: {'; '.join(problems)}"
                warnings.append(ChainWarning(cls, name, line, text))
            elif route.strategy == "ordered":
                problem = _order_problem(tier, route.tiers, usable)
                if problem is not None:
                    warnings.append(ChainWarning(cls, name, line, problem))
    return warnings
