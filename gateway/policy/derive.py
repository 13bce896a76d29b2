"""Routes derived from measurements: each class's chain from its tiers' measured quality and
speed on this machine (pure).

The operator states what a class needs (``routes.<class>.derive`` in policies/routing.yaml): a
quality ``floor`` (the tier's next-token agreement with the reference tier on the categories
the class needs, 0..1) and what to ``minimise``:

- ``latency``: the expected seconds of one answer alone on the tier, ``ttft + answer_tokens x
  tpot`` at concurrency 1;
- ``throughput``: seconds per output token under load (1 / output tokens per second at the
  calibration's highest concurrency).

``derive_chain`` keeps the route's tiers that were measured and meet the floor, drops any that
another kept tier beats on both quality and cost (never a tier that is slower *and* worse; a
less accurate tier must be ``min_gain`` cheaper than every more accurate one to stay),
orders the rest cheapest first and puts the reference last (the tier of last resort, whatever
its cost). Dominated tiers that meet the floor follow the reference as overflow (``overflow:
true``, the default; cheapest first, but never before a tier that dominates them): no request
goes to them while a tier before them can take it, but a saturated or draining chain degrades
to them instead of refusing. Without figures for a route's tiers the route stays as written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from common.class_categories import CLASS_CATEGORIES
from gateway.policy.schema import CLASS_NAMES, MIN_GAIN, Route, RoutingPolicy


@dataclass(frozen=True)
class TierFigures:
    """One tier's measured quality (per category, vs the reference) and speed."""

    name: str
    quality: Mapping[str, float]  # category -> agreement with the reference, 0..1
    ttft_s: float  # time to first token, one request alone
    tpot_s: float  # time per output token, one request alone
    throughput_tok_s: float  # output tokens per second at the calibration's concurrency
    classes: frozenset[str] | None = None  # classes the admission check let it serve (None: all)

    def quality_for(self, cls: str) -> float | None:
        """The lowest agreement over the class's categories (``None``: not measured)."""
        values = [self.quality.get(c) for c in CLASS_CATEGORIES.get(cls, ("chat",))]
        return None if any(v is None for v in values) else min(v for v in values if v is not None)

    def cost(self, minimise: str, answer_tokens: int) -> float:
        if minimise == "throughput":
            return 1.0 / self.throughput_tok_s if self.throughput_tok_s > 0 else float("inf")
        return self.ttft_s + answer_tokens * self.tpot_s


@dataclass(frozen=True)
class Goal:
    floor: float
    minimise: str = "latency"  # latency | throughput
    answer_tokens: int = 128
    # A tier that agrees less than another kept tier stays only when it is at least this much
    # cheaper (schema.MIN_GAIN); measurements on a shared machine are noisy, quality loss is not.
    min_gain: float = MIN_GAIN
    overflow: bool = True  # keep dominated tiers after the reference, for overload only


@dataclass(frozen=True)
class DerivedChain:
    cls: str
    chain: tuple[str, ...]  # the preferred order, the reference last
    reasons: Mapping[str, str] = field(default_factory=dict)  # tier -> why kept, where, or left out
    # Dominated tiers that meet the floor: after the reference, tried only when every tier
    # before them is unusable (saturated, draining, down): degrade before shedding.
    overflow: tuple[str, ...] = ()

    @property
    def tiers(self) -> tuple[str, ...]:
        """What the route serves: the chain, then the overflow."""
        return self.chain + self.overflow

    def describe(self) -> str:
        """One line: the chain and each tier's figures or why it was left out."""
        parts = [f"{name}: {why}" for name, why in self.reasons.items()]
        extra = f" then overflow {', '.join(self.overflow)}" if self.overflow else ""
        head = ", ".join(self.chain) or "as written"
        return f"{self.cls} -> {head}{extra} ({'; '.join(parts)})"


def derive_chain(
    cls: str,
    tiers: Sequence[str],
    goal: Goal,
    figures: Mapping[str, TierFigures],
    reference: str,
) -> DerivedChain:
    """The class's chain from ``tiers`` (the route as written; see the module docstring)."""
    if not any(name in figures for name in tiers):
        return DerivedChain(cls, tuple(tiers), {"*": "no measurements: the route as written"})
    reasons: dict[str, str] = {}
    kept: list[tuple[str, float, float]] = []  # name, quality, cost
    for name in tiers:
        tier = figures.get(name)
        if tier is None:
            reasons[name] = "not measured"
            continue
        if tier.classes is not None and cls not in tier.classes:
            reasons[name] = f"not admitted for {cls} by the in-engine check"
            continue
        quality = 1.0 if name == reference else tier.quality_for(cls)
        if quality is None:
            reasons[name] = f"no quality figure for {cls}"
            continue
        cost = tier.cost(goal.minimise, goal.answer_tokens)
        if quality < goal.floor:
            reasons[name] = f"agreement {quality:.3f} < floor {goal.floor:.2f}"
            continue
        kept.append((name, quality, cost))
    survivors = []
    overflow: list[tuple[str, float, float]] = []  # name, quality, cost
    for name, quality, cost in kept:
        better = [
            other for other, q, c in kept if _beats((other, q, c), (name, quality, cost), goal)
        ]
        if better and name != reference:
            reasons[name] = (
                f"dominated by {better[0]} ({_why_dominated(kept, better[0], cost, goal)})"
            )
            if goal.overflow:
                reasons[name] += ": overflow only"
                overflow.append((name, quality, cost))
            continue
        survivors.append((name, quality, cost))
    if not survivors:  # serve rather than refuse: the operator sees why in the reasons
        reasons["*"] = "no measured tier meets the floor: the route as written"
        return DerivedChain(cls, tuple(tiers), reasons)
    survivors.sort(key=lambda item: (item[0] == reference, item[2]))
    unit = "s/answer" if goal.minimise == "latency" else "s/token"
    for name, quality, cost in survivors:
        reasons[name] = f"agreement {quality:.3f}, {cost:.3g} {unit}"
    # Overflow by cost, but never before a tier that dominates it (the same rule as the chain).
    return DerivedChain(
        cls,
        tuple(name for name, _, _ in survivors),
        reasons,
        _overflow_order(overflow, goal),
    )


def _overflow_order(tiers: list[tuple[str, float, float]], goal: Goal) -> tuple[str, ...]:
    """Cheapest first, but never before a tier that dominates it: each step takes the cheapest
    tier no remaining one beats (dominance has no cycles: in one, every quality would be equal
    and every cost lower than the last)."""
    left, out = list(tiers), []
    while left:
        free = [t for t in left if not any(_beats(o, t, goal) for o in left)]
        pick = min(free or left, key=lambda item: item[2])
        out.append(pick[0])
        left.remove(pick)
    return tuple(out)


def derive_routes(
    policy: RoutingPolicy, figures: Mapping[str, TierFigures], reference: str | None
) -> tuple[RoutingPolicy, dict[str, DerivedChain]]:
    """``policy`` with every ``derive`` route's tiers replaced by the derived chain, and each
    derivation (for ``/admin/policy`` and ``up``'s console)."""
    if not figures:
        return policy, {}
    routes: dict[str, Route] = {}
    derived: dict[str, DerivedChain] = {}
    for cls in CLASS_NAMES:
        route = policy.routes.for_class(cls)
        if route is None or route.derive is None:
            continue
        goal = Goal(
            route.derive.floor,
            route.derive.minimise,
            route.derive.answer_tokens,
            route.derive.min_gain,
            route.derive.overflow,
        )
        chain = derive_chain(cls, route.tiers, goal, figures, reference or "")
        derived[cls] = chain
        routes[cls] = route.model_copy(update={"tiers": list(chain.tiers)})
    if not routes:
        return policy, {}
    new_routes = policy.routes.model_copy(update=routes)
    return policy.model_copy(update={"routes": new_routes}), derived


def _beats(a: tuple[str, float, float], b: tuple[str, float, float], goal: Goal) -> bool:
    """Whether tier ``a`` (name, quality, cost) dominates ``b``: at least as good, and as cheap
    when as good, else not ``min_gain`` dearer; strictly better on one of the two."""
    (name_a, qa, ca), (name_b, qb, cb) = a, b
    return (
        name_a != name_b
        and qa >= qb
        and (ca <= cb if qa == qb else ca * (1 - goal.min_gain) <= cb)
        and (qa > qb or ca < cb)
    )


def _why_dominated(
    kept: list[tuple[str, float, float]], other: str, cost: float, goal: Goal
) -> str:
    """Why ``other`` beats a tier of ``cost`` (the tier's own quality is below or equal)."""
    _, _, other_cost = next(item for item in kept if item[0] == other)
    if other_cost <= cost:
        return "as good or better, and as cheap or cheaper"
    return f"better, and this tier is not more than {goal.min_gain * 100:g}% cheaper"
