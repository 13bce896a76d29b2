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

How sure "``min_gain`` cheaper" must be (gateway/policy/confidence.py): with the calibration's
per-prompt samples (interleaved, so paired by prompt) and the ``latency`` goal, a less accurate
tier stays ahead of a more accurate one only when the *lower* bound of its gain's bootstrap
interval (``confidence``, 95 % by default) clears ``min_gain``; without samples (a file written
before they were kept, or the ``throughput`` goal, one figure per tier) the point figures decide
as before, and the reason says so. A tier served emulated (the reference's arithmetic on
dequantized weights) is never ahead of the reference, whatever its figures: it can only be
overflow, and against other tiers its cost is taken as at least the reference's.

Hysteresis: given the ``previous`` derivation of the class, a less accurate tier that was served
ahead of a more accurate one keeps its place until its gain is significantly *below*
``min_gain`` (the interval's upper bound no longer clears it); a tier not ahead before needs
the lower bound to clear it. Between the two the order stays: re-measuring noisy figures does
not flap a route. Without samples both are the point rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from common.class_categories import CLASS_CATEGORIES
from gateway.policy.confidence import GainInterval, answer_costs, paired_gain
from gateway.policy.schema import CLASS_NAMES, CONFIDENCE, MIN_GAIN, Route, RoutingPolicy


@dataclass(frozen=True)
class TierFigures:
    """One tier's measured quality (per category, vs the reference) and speed."""

    name: str
    quality: Mapping[str, float]  # category -> agreement with the reference, 0..1
    ttft_s: float  # time to first token, one request alone
    tpot_s: float  # time per output token, one request alone
    throughput_tok_s: float  # output tokens per second at the calibration's concurrency
    classes: frozenset[str] | None = None  # classes the admission check let it serve (None: all)
    # Per prompt of the calibration's requests alone, in prompt order (index i is the same
    # prompt on every tier, measured back to back); None where that request failed; empty:
    # not kept (an older measurement).
    ttfts_s: tuple[float | None, ...] = ()
    tpots_s: tuple[float | None, ...] = ()
    # Served emulated: the reference's arithmetic on dequantized weights, never cheaper.
    emulated: bool = False
    concurrency: int = 4  # requests at once when throughput_tok_s was measured

    def quality_for(self, cls: str) -> float | None:
        """The lowest agreement over the class's categories (``None``: not measured)."""
        values = [self.quality.get(c) for c in CLASS_CATEGORIES.get(cls, ("chat",))]
        return None if any(v is None for v in values) else min(v for v in values if v is not None)

    def cost(self, minimise: str, answer_tokens: int) -> float:
        if minimise == "throughput":
            return 1.0 / self.throughput_tok_s if self.throughput_tok_s > 0 else float("inf")
        return self.ttft_s + answer_tokens * self.tpot_s

    def samples(self, minimise: str, answer_tokens: int) -> tuple[float | None, ...]:
        """Per-prompt costs for ``minimise`` (empty: none kept; throughput has one figure)."""
        if minimise != "latency" or not self.ttfts_s:
            return ()
        return answer_costs(self.ttfts_s, self.tpots_s, answer_tokens)


@dataclass(frozen=True)
class Goal:
    floor: float
    minimise: str = "latency"  # latency | throughput
    answer_tokens: int = 128
    # A tier that agrees less than another kept tier stays only when it is at least this much
    # cheaper (schema.MIN_GAIN); measurements on a shared machine are noisy, quality loss is not.
    min_gain: float = MIN_GAIN
    overflow: bool = True  # keep dominated tiers after the reference, for overload only
    confidence: float = CONFIDENCE  # the gain interval's level (schema.CONFIDENCE)


@dataclass(frozen=True)
class DerivedChain:
    cls: str
    chain: tuple[str, ...]  # the preferred order, the reference last
    reasons: Mapping[str, str] = field(default_factory=dict)  # tier -> why kept, where, or left out
    # Dominated tiers that meet the floor: after the reference, tried only when every tier
    # before them is unusable (saturated, draining, down): degrade before shedding.
    overflow: tuple[str, ...] = ()
    as_written: bool = False  # no usable figures: the route as written, not a measured order

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
    previous: DerivedChain | None = None,
) -> DerivedChain:
    """The class's chain from ``tiers`` (the route as written; see the module docstring);
    ``previous``: the class's last derivation, whose order holds unless the figures now
    differ significantly (hysteresis)."""
    if not any(name in figures for name in tiers):
        return DerivedChain(
            cls, tuple(tiers), {"*": "no measurements: the route as written"}, as_written=True
        )
    reasons: dict[str, str] = {}
    kept: list[_Kept] = []
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
        if quality < goal.floor:
            reasons[name] = f"agreement {quality:.3f} < floor {goal.floor:.2f}"
            continue
        kept.append(_kept(tier, quality, goal, figures.get(reference), reference))
    rules = _Rules(goal, reference, _ahead(previous))
    survivors: list[_Kept] = []
    overflow: list[_Kept] = []
    for item in kept:
        better = [other for other in kept if _beats(other, item, rules)]
        if better and item.name != reference:
            reasons[item.name] = f"dominated by {better[0].name} ({rules.why(item, better[0])})"
            if goal.overflow:
                reasons[item.name] += ": overflow only"
                overflow.append(item)
            continue
        survivors.append(item)
    if not survivors:  # serve rather than refuse: the operator sees why in the reasons
        reasons["*"] = "no measured tier meets the floor: the route as written"
        return DerivedChain(cls, tuple(tiers), reasons, as_written=True)
    # Every survivor less accurate than another cleared it (the rules above): it goes first;
    # as accurate, the cheaper first. With the point rule this is simply cheapest first.
    survivors.sort(key=lambda t: (t.name == reference, t.quality, t.cost))
    unit = "s/answer" if goal.minimise == "latency" else "s/token"
    for item in survivors:
        reasons[item.name] = f"agreement {item.quality:.3f}, {item.cost:.3g} {unit}"
        if item.emulated and reference in figures:
            reasons[item.name] += f" (emulated: costed as at least {reference})"
        gain = rules.tightest(item, [t for t in kept if t.quality > item.quality])
        if gain:
            reasons[item.name] += f"; {gain}"
    # Overflow by cost, but never before a tier that dominates it (the same rule as the chain).
    return DerivedChain(
        cls,
        tuple(t.name for t in survivors),
        reasons,
        _overflow_order(overflow, rules),
    )


@dataclass(frozen=True)
class _Kept:
    """A tier that meets the floor, with the cost (and per-prompt costs) the rules compare."""

    name: str
    quality: float
    cost: float
    samples: tuple[float | None, ...]
    emulated: bool = False


def _kept(
    tier: TierFigures, quality: float, goal: Goal, ref: TierFigures | None, reference: str
) -> _Kept:
    """The tier as compared; an emulated one costs at least what the reference does (per
    prompt too: it does the reference's arithmetic, any gain is noise)."""
    cost = tier.cost(goal.minimise, goal.answer_tokens)
    samples = tier.samples(goal.minimise, goal.answer_tokens)
    if not tier.emulated or tier.name == reference:
        return _Kept(tier.name, quality, cost, samples)
    if ref is None:
        return _Kept(tier.name, quality, cost, samples, emulated=True)
    ref_samples = ref.samples(goal.minimise, goal.answer_tokens)
    floored = tuple(
        None if a is None or b is None else max(a, b)
        for a, b in zip(samples, ref_samples, strict=False)
    )
    ref_cost = ref.cost(goal.minimise, goal.answer_tokens)
    return _Kept(tier.name, quality, max(cost, ref_cost), floored, emulated=True)


def _ahead(previous: DerivedChain | None) -> frozenset[tuple[str, str]]:
    """(b, a): tier b was served before tier a by the previous derivation (hysteresis)."""
    if previous is None or previous.as_written:
        return frozenset()
    order = previous.tiers
    return frozenset(
        (b, a) for i, b in enumerate(order) if b in previous.chain for a in order[i + 1 :]
    )


@dataclass(frozen=True)
class _Rules:
    """When a less accurate tier may go before a more accurate one (the module docstring)."""

    goal: Goal
    reference: str
    ahead: frozenset[tuple[str, str]] = frozenset()

    def interval(self, b: _Kept, a: _Kept) -> GainInterval | None:
        """``b``'s gain over ``a`` with its interval (``None``: no paired samples)."""
        if not b.samples or not a.samples:
            return None
        return paired_gain(b.samples, a.samples, self.goal.confidence)

    def clears(self, b: _Kept, a: _Kept) -> bool:
        """Whether ``b`` (less accurate than ``a``) is cheap enough to be served before it."""
        if b.emulated and a.name == self.reference:
            return False
        interval = self.interval(b, a)
        if interval is None:
            return b.cost < a.cost * (1 - self.goal.min_gain)
        if (b.name, a.name) in self.ahead:  # it stays until significantly below
            return interval.high > self.goal.min_gain
        return interval.low > self.goal.min_gain

    def why(self, b: _Kept, a: _Kept) -> str:
        """Why ``a`` beats ``b`` (``b``'s quality is below or equal)."""
        if b.emulated and a.name == self.reference:
            return (
                f"emulated: {a.name}'s arithmetic on dequantized weights is never cheaper than "
                f"{a.name}, whatever the figures"
            )
        interval = self.interval(b, a)
        shown = f"; {interval.describe(a.name)}" if interval else ""
        if a.cost <= b.cost:
            return f"as good or better, and as cheap or cheaper{shown}"
        pct = f"{self.goal.min_gain * 100:g}%"
        if interval is None:
            return (
                f"better, and this tier is not more than {pct} cheaper "
                "(point figures: no per-prompt samples)"
            )
        bound = (
            "its upper bound is below"
            if (b.name, a.name) in self.ahead
            else "its lower bound does not clear"
        )
        level = f"{self.goal.confidence * 100:g}%"
        return f"better, and this tier's {interval.describe(a.name)} at {level}: {bound} {pct}"

    def tightest(self, b: _Kept, better: Sequence[_Kept]) -> str:
        """The gain ``b`` had to show over the more accurate tiers, the closest call."""
        if b.emulated or not better:
            return ""
        shown = []
        for a in better:
            interval = self.interval(b, a)
            if interval is None:
                gain = 1 - b.cost / a.cost if a.cost > 0 else 0.0
                shown.append((gain, f"gain {gain:.2f} over {a.name} (point figures)"))
                continue
            text = interval.describe(a.name)
            if interval.low <= self.goal.min_gain:
                text += " (kept ahead as before: not significantly below min_gain)"
            shown.append((interval.low, text))
        return min(shown)[1]


def _beats(a: _Kept, b: _Kept, rules: _Rules) -> bool:
    """Whether tier ``a`` dominates ``b``: at least as good, and as cheap when as good, else
    ``b`` does not clear ``min_gain`` against it (``_Rules.clears``); an emulated tier never
    beats the reference and the reference always beats it."""
    if a.name == b.name or a.quality < b.quality:
        return False
    if a.name == rules.reference and b.emulated:
        return True
    if a.quality == b.quality:
        return a.cost < b.cost
    return not rules.clears(b, a)


def _overflow_order(tiers: list[_Kept], rules: _Rules) -> tuple[str, ...]:
    """Cheapest first, but never before a tier that dominates it: each step takes the cheapest
    tier no remaining one beats (dominance has no cycles: in one, every quality would be equal
    and every cost lower than the last)."""
    left, out = list(tiers), []
    while left:
        free = [t for t in left if not any(_beats(o, t, rules) for o in left)]
        pick = min(free or left, key=lambda t: t.cost)
        out.append(pick.name)
        left.remove(pick)
    return tuple(out)


def derive_routes(
    policy: RoutingPolicy,
    figures: Mapping[str, TierFigures],
    reference: str | None,
    previous: Mapping[str, DerivedChain] | None = None,
) -> tuple[RoutingPolicy, dict[str, DerivedChain]]:
    """``policy`` with every ``derive`` route's tiers replaced by the derived chain, and each
    derivation (for ``/admin/policy`` and ``up``'s console); ``previous``: the last
    derivations by class, kept unless the figures now differ significantly (hysteresis)."""
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
            route.derive.confidence,
        )
        last = (previous or {}).get(cls)
        chain = derive_chain(cls, route.tiers, goal, figures, reference or "", last)
        derived[cls] = chain
        routes[cls] = route.model_copy(update={"tiers": list(chain.tiers)})
    if not routes:
        return policy, {}
    new_routes = policy.routes.model_copy(update=routes)
    return policy.model_copy(update={"routes": new_routes}), derived


def scaled(figures: TierFigures, factor: float) -> TierFigures:
    """``figures`` with its per-token time ``factor`` times what the calibration measured (live
    routes: gateway/policy/live.py)."""
    if factor == 1.0:
        return figures
    return dataclasses.replace(
        figures,
        tpot_s=figures.tpot_s * factor,
        tpots_s=tuple(None if t is None else t * factor for t in figures.tpots_s),
        throughput_tok_s=figures.throughput_tok_s / factor,
    )


def apply_factors(
    figures: Mapping[str, TierFigures], factors: Mapping[str, float]
) -> dict[str, TierFigures]:
    """Every tier's figures, scaled by its live factor where it has one."""
    return {name: scaled(f, factors.get(name, 1.0)) for name, f in figures.items()}
