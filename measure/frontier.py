"""The routing evaluation's figures, pure: confusion matrix, traffic shares, the frontier.

Every prompt was answered greedily by every tier directly and once through the gateway.
- quality of an answer: its token agreement with the reference (fp16) tier's answer to the
  same prompt (``quality.sequence_agreement``); a deployment's quality is the mean over the
  prompts, so an all-reference deployment scores exactly 1;
- cost saving of a deployment: the share of its tokens (prompt + completion) served by a
  tier other than the reference;
- a deployment = an assignment class -> tier, classes being the gateway's own
  (``x-route-class``); each assignment is a (cost share, quality) point; the Pareto frontier
  keeps the points no other point beats on both.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    """One prompt: its label, what the gateway did, and every tier's direct answer."""

    label: str
    route_class: str  # x-route-class
    route_tier: str  # x-route-tier
    gateway_tokens: int  # prompt + completion tokens of the gateway's answer
    gateway_quality: float  # the gateway's answer against the reference tier's
    tokens: Mapping[str, int]  # tier -> prompt + completion tokens of its direct answer
    quality: Mapping[str, float]  # tier -> its direct answer against the reference tier's
    route_reason: str = ""  # x-route-reason (says when a saturated tier was skipped)


@dataclass(frozen=True)
class Point:
    assignment: tuple[tuple[str, str], ...]  # (class, tier) for the classes seen
    cheap_share: float  # share of tokens served by tiers other than the reference
    quality: float


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


def point(outcomes: Sequence[Outcome], assignment: Mapping[str, str], reference: str) -> Point:
    """The deployment that sends each class to ``assignment[class]``."""
    if not outcomes:
        raise ValueError("no outcomes")
    tiers = [assignment[o.route_class] for o in outcomes]
    total = sum(o.tokens[t] for o, t in zip(outcomes, tiers, strict=True))
    cheap = sum(o.tokens[t] for o, t in zip(outcomes, tiers, strict=True) if t != reference)
    quality = sum(o.quality[t] for o, t in zip(outcomes, tiers, strict=True)) / len(outcomes)
    pairs = tuple(sorted(assignment.items()))
    return Point(pairs, cheap / total if total else 0.0, quality)


def all_points(outcomes: Sequence[Outcome], tiers: Sequence[str], reference: str) -> list[Point]:
    """Every assignment of the classes seen to the tiers (len(tiers) ** classes points)."""
    classes = sorted({o.route_class for o in outcomes})
    return [
        point(outcomes, dict(zip(classes, choice, strict=True)), reference)
        for choice in itertools.product(tiers, repeat=len(classes))
    ]


def gateway_point(outcomes: Sequence[Outcome], reference: str) -> Point:
    """What the gateway actually did: its tiers, its answers' quality, its token counts."""
    if not outcomes:
        raise ValueError("no outcomes")
    total = sum(o.gateway_tokens for o in outcomes)
    cheap = sum(o.gateway_tokens for o in outcomes if o.route_tier != reference)
    routes = sorted({(o.route_class, o.route_tier) for o in outcomes})
    quality = sum(o.gateway_quality for o in outcomes) / len(outcomes)
    return Point(tuple(routes), cheap / total if total else 0.0, quality)


def pareto(points: Sequence[Point]) -> list[Point]:
    """Points not dominated (another at least as cheap-shared AND as good, better in one),
    by increasing cheap share; of equal points the first is kept."""
    ordered = sorted(points, key=lambda p: (-p.cheap_share, -p.quality))
    frontier: list[Point] = []
    best = float("-inf")
    for p in ordered:  # most savings first; keep a point only if it improves quality
        if p.quality > best:
            frontier.append(p)
            best = p.quality
    return sorted(frontier, key=lambda p: p.cheap_share)
