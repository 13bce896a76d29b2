"""The routing evaluation's figures, pure: confusion matrix, traffic shares, the frontier.

Every prompt was answered greedily by every tier directly and once through the gateway.
- quality of an answer: its token agreement with the reference (fp16) tier's answer to the
  same prompt (``quality.sequence_agreement``); a deployment's quality is the mean over the
  prompts, so an all-reference deployment scores exactly 1;
- cost of a deployment: the expected seconds per request on this machine, the mean over the
  prompts of ``ttft + completion_tokens x tpot`` of the tier that serves it, with that tier's
  measured TTFT and TPOT (``up``'s speed calibration, measure/speed.py) and the length of that
  tier's own answer. It is what a request costs the tier it occupies (a tier's decode time is
  what it cannot give to other requests), the same ``latency`` cost the gateway's derived
  routes minimise (gateway/policy/derive.py), and it follows the machine: a low precision that
  decodes slower than fp16 here costs more than fp16;
- a deployment = an assignment class -> tier, classes being the gateway's own
  (``x-route-class``); each assignment is a (seconds, quality) point; the Pareto frontier
  keeps the points no other point beats on both; ``gap`` says whether the gateway's own
  point is on it, and by how much it is not.

The share of tokens served off the reference is kept beside the cost (``off_reference``): it
describes the traffic, it is not a cost.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

EPS = 1e-9  # float noise when comparing means summed in the same order


@dataclass(frozen=True)
class Speed:
    """One tier's measured speed on this machine."""

    ttft_s: float  # time to first token, one request alone
    tpot_s: float  # time per output token, one request alone

    def seconds(self, completion_tokens: int) -> float:
        """Expected seconds of one answer of ``completion_tokens`` on the tier."""
        return self.ttft_s + completion_tokens * self.tpot_s


@dataclass(frozen=True)
class Outcome:
    """One prompt: its label, what the gateway did, and every tier's direct answer."""

    label: str
    route_class: str  # x-route-class
    route_tier: str  # x-route-tier
    prompt_tokens: int  # the prompt's tokens (the same on every tier: one tokenizer)
    gateway_completion: int  # completion tokens of the gateway's answer
    gateway_quality: float  # the gateway's answer against the reference tier's
    completion: Mapping[str, int]  # tier -> completion tokens of its direct answer
    quality: Mapping[str, float]  # tier -> its direct answer against the reference tier's
    route_reason: str = ""  # x-route-reason (says when a saturated tier was skipped)

    @property
    def gateway_tokens(self) -> int:
        return self.prompt_tokens + self.gateway_completion

    def tokens(self, tier: str) -> int:
        """Prompt + completion tokens of ``tier``'s direct answer."""
        return self.prompt_tokens + self.completion[tier]


@dataclass(frozen=True)
class Point:
    assignment: tuple[tuple[str, str], ...]  # (class, tier) for the classes seen
    seconds: float  # mean expected seconds per request (the cost)
    quality: float
    off_reference: float  # share of tokens served by tiers other than the reference


@dataclass(frozen=True)
class Gap:
    """Where the gateway's point stands against all assignments."""

    on_frontier: bool
    quality_gain: float  # best quality at no more cost than the gateway's, minus its (>= 0)
    seconds_saved: float  # its cost minus the cheapest cost at no less quality (>= 0)
    by: Point | None  # the best assignment at no more cost than the gateway's, when beaten


def confusion(outcomes: Sequence[Outcome], classes: Sequence[str]) -> dict[str, dict[str, int]]:
    """label -> gateway class -> count, every class present (zeros included)."""
    matrix = {label: dict.fromkeys(classes, 0) for label in classes}
    for o in outcomes:
        row = matrix.setdefault(o.label, dict.fromkeys(classes, 0))
        row[o.route_class] = row.get(o.route_class, 0) + 1
    return matrix


def shares(outcomes: Sequence[Outcome], tiers: Sequence[str]) -> dict[str, dict[str, float]]:
    """tier -> {"requests": share, "tokens": share} of the gateway's traffic."""
    if not outcomes:
        raise ValueError("no outcomes")
    requests = len(outcomes)
    tokens = sum(o.gateway_tokens for o in outcomes)
    names = list(dict.fromkeys([*tiers, *(o.route_tier for o in outcomes)]))
    return {
        tier: {
            "requests": sum(o.route_tier == tier for o in outcomes) / requests,
            "tokens": (sum(o.gateway_tokens for o in outcomes if o.route_tier == tier) / tokens)
            if tokens
            else 0.0,
        }
        for tier in names
    }


def _speed(speeds: Mapping[str, Speed], tier: str) -> Speed:
    if tier not in speeds:
        raise ValueError(f"no measured speed for tier {tier}")
    return speeds[tier]


def point(
    outcomes: Sequence[Outcome],
    assignment: Mapping[str, str],
    speeds: Mapping[str, Speed],
    reference: str,
) -> Point:
    """The deployment that sends each class to ``assignment[class]``."""
    if not outcomes:
        raise ValueError("no outcomes")
    served = [(o, assignment[o.route_class]) for o in outcomes]
    total = sum(o.tokens(t) for o, t in served)
    off = sum(o.tokens(t) for o, t in served if t != reference)
    seconds = sum(_speed(speeds, t).seconds(o.completion[t]) for o, t in served)
    quality = sum(o.quality[t] for o, t in served)
    pairs = tuple(sorted(assignment.items()))
    n = len(outcomes)
    return Point(pairs, seconds / n, quality / n, off / total if total else 0.0)


def all_points(
    outcomes: Sequence[Outcome], tiers: Sequence[str], speeds: Mapping[str, Speed], reference: str
) -> list[Point]:
    """Every assignment of the classes seen to the tiers (len(tiers) ** classes points)."""
    classes = sorted({o.route_class for o in outcomes})
    return [
        point(outcomes, dict(zip(classes, choice, strict=True)), speeds, reference)
        for choice in itertools.product(tiers, repeat=len(classes))
    ]


def gateway_point(
    outcomes: Sequence[Outcome], speeds: Mapping[str, Speed], reference: str
) -> Point:
    """What the gateway actually did: its tiers, its answers' quality and lengths."""
    if not outcomes:
        raise ValueError("no outcomes")
    total = sum(o.gateway_tokens for o in outcomes)
    off = sum(o.gateway_tokens for o in outcomes if o.route_tier != reference)
    seconds = sum(_speed(speeds, o.route_tier).seconds(o.gateway_completion) for o in outcomes)
    routes = sorted({(o.route_class, o.route_tier) for o in outcomes})
    n = len(outcomes)
    quality = sum(o.gateway_quality for o in outcomes) / n
    return Point(tuple(routes), seconds / n, quality, off / total if total else 0.0)


def routed_point(outcomes: Sequence[Outcome], speeds: Mapping[str, Speed], reference: str) -> Point:
    """The gateway's routing decisions scored like every assignment: each prompt costs and
    scores what its routed tier's direct answer does. Whether the routing is on the frontier is
    judged on this point; the gateway's own answers (``gateway_point``) also carry the
    engine's run-to-run differences (a greedy answer through the gateway, batched with other
    requests, is not always the tier's direct answer), which no routing can remove."""
    if not outcomes:
        raise ValueError("no outcomes")
    total = sum(o.tokens(o.route_tier) for o in outcomes)
    off = sum(o.tokens(o.route_tier) for o in outcomes if o.route_tier != reference)
    seconds = sum(
        _speed(speeds, o.route_tier).seconds(o.completion[o.route_tier]) for o in outcomes
    )
    routes = sorted({(o.route_class, o.route_tier) for o in outcomes})
    quality = sum(o.quality[o.route_tier] for o in outcomes) / len(outcomes)
    return Point(tuple(routes), seconds / len(outcomes), quality, off / total if total else 0.0)


def dominates(a: Point, b: Point) -> bool:
    """``a`` is as cheap and as good as ``b``, and better in one."""
    return (
        a.seconds <= b.seconds + EPS
        and a.quality >= b.quality - EPS
        and (a.seconds < b.seconds - EPS or a.quality > b.quality + EPS)
    )


def pareto(points: Sequence[Point]) -> list[Point]:
    """Points no other dominates, by increasing cost; of equal points the first is kept."""
    ordered = sorted(points, key=lambda p: (p.seconds, -p.quality))
    frontier: list[Point] = []
    best = float("-inf")
    for p in ordered:  # cheapest first; keep a point only if it improves quality
        if p.quality > best + EPS:
            frontier.append(p)
            best = p.quality
    return frontier


def gap(actual: Point, points: Sequence[Point]) -> Gap:
    """Whether any assignment beats the gateway's point, and by how much (see ``Gap``)."""
    cheaper = [p for p in points if p.seconds <= actual.seconds + EPS]
    better = [p for p in points if p.quality >= actual.quality - EPS]
    best_q = max(cheaper, key=lambda p: (p.quality, -p.seconds), default=None)
    cheapest = min(better, key=lambda p: (p.seconds, -p.quality), default=None)
    gain = max(0.0, best_q.quality - actual.quality) if best_q else 0.0
    saved = max(0.0, actual.seconds - cheapest.seconds) if cheapest else 0.0
    # When any point dominates the gateway's, the best one at its cost does too.
    if not any(dominates(p, actual) for p in points):
        return Gap(True, 0.0, 0.0, None)
    return Gap(False, gain, saved, best_q)
