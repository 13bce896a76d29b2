"""measure/frontier.py: confusion, shares, assignments, the frontier on a measured cost axis."""

from __future__ import annotations

import itertools

import pytest

from measure.frontier import (
    Outcome,
    Point,
    Speed,
    all_points,
    confusion,
    dominates,
    gap,
    gateway_point,
    pareto,
    routed_point,
    shares,
)

TIERS = ("fp16", "int8", "int4")
CLASSES = ("tolerant", "code", "math", "long")
# int4 fastest, int8 between, fp16 slowest (a machine where low precision pays)
FAST_LOW = {"fp16": Speed(0.05, 0.020), "int8": Speed(0.04, 0.015), "int4": Speed(0.03, 0.010)}
# the AVX-512 EPYC case: int4 and int8 decode slower than fp16
SLOW_LOW = {"fp16": Speed(0.05, 0.019), "int8": Speed(0.05, 0.024), "int4": Speed(0.06, 0.026)}


def outcome(
    label: str, cls: str, tier: str, q8: float, q4: float, prompt: int = 10, out: int = 20
) -> Outcome:
    return Outcome(
        label=label,
        route_class=cls,
        route_tier=tier,
        prompt_tokens=prompt,
        gateway_completion=out,
        gateway_quality={"fp16": 1.0, "int8": q8, "int4": q4}[tier],
        completion=dict.fromkeys(TIERS, out),
        quality={"fp16": 1.0, "int8": q8, "int4": q4},
    )


OUTCOMES = [
    outcome("tolerant", "tolerant", "int4", 0.9, 0.8, prompt=20, out=10),
    outcome("tolerant", "code", "fp16", 0.9, 0.7, out=40),
    outcome("code", "code", "fp16", 0.5, 0.2, out=40),
    outcome("math", "math", "fp16", 0.6, 0.1, prompt=30, out=20),
]


def _by(points: list[Point], *tiers: str) -> Point:
    """The point assigning the sorted classes seen to ``tiers`` in order."""
    return next(p for p in points if tuple(t for _, t in p.assignment) == tiers)


def test_confusion_counts_every_prompt_once() -> None:
    matrix = confusion(OUTCOMES, CLASSES)
    assert matrix["tolerant"] == {"tolerant": 1, "code": 1, "math": 0, "long": 0}
    assert matrix["code"]["code"] == 1 and matrix["math"]["math"] == 1
    assert sum(sum(row.values()) for row in matrix.values()) == len(OUTCOMES)


def test_shares_sum_to_one() -> None:
    got = shares(OUTCOMES, TIERS)
    assert got["int4"] == {"requests": 0.25, "tokens": 30 / 180}
    assert got["fp16"]["requests"] == 0.75 and got["int8"]["requests"] == 0.0
    assert sum(s["requests"] for s in got.values()) == pytest.approx(1.0)
    assert sum(s["tokens"] for s in got.values()) == pytest.approx(1.0)


def test_a_points_cost_is_the_measured_seconds_of_each_answer() -> None:
    points = all_points(OUTCOMES, TIERS, FAST_LOW, "fp16")
    assert len(points) == 3**3  # three classes seen: code, math, tolerant
    base = _by(points, "fp16", "fp16", "fp16")
    # fp16: 0.05 s + answer tokens x 0.020 s, answers of 10, 40, 40, 20 tokens
    expected = sum(0.05 + n * 0.020 for n in (10, 40, 40, 20)) / 4
    assert (base.seconds, base.quality, base.off_reference) == (pytest.approx(expected), 1.0, 0.0)
    cheapest = _by(points, "int4", "int4", "int4")
    assert cheapest.seconds == pytest.approx(sum(0.03 + n * 0.010 for n in (10, 40, 40, 20)) / 4)
    assert cheapest.quality == pytest.approx((0.8 + 0.7 + 0.2 + 0.1) / 4)
    assert cheapest.off_reference == 1.0


def test_a_tier_that_answers_longer_costs_more_than_its_tpot_alone_says() -> None:
    speeds = {"fp16": Speed(0.0, 0.020), "int8": Speed(0.0, 0.010)}
    quality = {"fp16": 1.0, "int8": 0.9}
    wordy = Outcome("tolerant", "tolerant", "int8", 5, 60, 0.9, {"fp16": 20, "int8": 60}, quality)
    points = {p.assignment: p for p in all_points([wordy], ["fp16", "int8"], speeds, "fp16")}
    assert points[(("tolerant", "int8"),)].seconds == pytest.approx(0.6)
    assert points[(("tolerant", "fp16"),)].seconds == pytest.approx(0.4)


def test_the_gateway_point_uses_what_it_did() -> None:
    p = gateway_point(OUTCOMES, FAST_LOW, "fp16")
    seconds = (0.03 + 10 * 0.010) + (0.05 + 40 * 0.020) * 2 + (0.05 + 20 * 0.020)
    assert p.seconds == pytest.approx(seconds / 4)
    assert p.quality == pytest.approx((0.8 + 1 + 1 + 1) / 4)
    assert p.off_reference == pytest.approx(30 / 180)


def test_the_routed_point_scores_the_routing_like_any_assignment() -> None:
    """The gateway routed exactly like all-fp16, but its own answers differ from fp16's direct
    ones here and there (the engine's run-to-run differences): judged on its own answers it
    would look dominated by the very assignment it made; its routing scored with the direct
    answers is that assignment's point, on the frontier."""
    same = [
        Outcome(
            label="tolerant",
            route_class="tolerant",
            route_tier="fp16",
            prompt_tokens=10,
            gateway_completion=20,
            gateway_quality=0.95,  # its answer drifted from the direct fp16 answer
            completion={"fp16": 20, "int8": 24, "int4": 30},
            quality={"fp16": 1.0, "int8": 0.9, "int4": 0.5},
        )
    ]
    points = all_points(same, TIERS, SLOW_LOW, "fp16")
    own, routed = gateway_point(same, SLOW_LOW, "fp16"), routed_point(same, SLOW_LOW, "fp16")
    assert own.quality == pytest.approx(0.95) and not gap(own, points).on_frontier
    assert (routed.seconds, routed.quality) == (
        _by(points, "fp16").seconds,
        _by(points, "fp16").quality,
    )
    assert gap(routed, points).on_frontier
    # With int4 served, its direct answer's length and agreement count, not the gateway's.
    int4 = [Outcome(**{**same[0].__dict__, "route_tier": "int4"})]
    p = routed_point(int4, SLOW_LOW, "fp16")
    assert p.quality == 0.5 and p.seconds == pytest.approx(0.06 + 30 * 0.026)
    assert p.off_reference == 1.0


def test_a_tier_without_a_measured_speed_is_refused() -> None:
    with pytest.raises(ValueError, match="no measured speed for tier int4"):
        all_points(OUTCOMES, TIERS, {"fp16": FAST_LOW["fp16"], "int8": FAST_LOW["int8"]}, "fp16")


def test_pareto_keeps_only_undominated_points() -> None:
    pts = [
        Point((("a", "x"),), 1.0, 1.0, 0.0),
        Point((("a", "y"),), 0.5, 0.9, 0.5),
        Point((("a", "z"),), 0.6, 0.8, 0.4),  # dominated by (0.5, 0.9)
        Point((("a", "w"),), 0.2, 0.5, 1.0),
        Point((("a", "v"),), 0.2, 0.4, 1.0),  # dominated by (0.2, 0.5)
    ]
    front = pareto(pts)
    assert [(p.seconds, p.quality) for p in front] == [(0.2, 0.5), (0.5, 0.9), (1.0, 1.0)]
    assert dominates(pts[1], pts[2]) and not dominates(pts[2], pts[1])
    assert not dominates(pts[0], pts[0])


def test_pareto_of_real_points_runs_from_cheapest_to_best() -> None:
    points = all_points(OUTCOMES, TIERS, FAST_LOW, "fp16")
    front = pareto(points)
    assert front[0] == _by(points, "int4", "int4", "int4")
    assert front[-1].quality == 1.0 and front[-1] == _by(points, "fp16", "fp16", "fp16")
    for a, b in itertools.pairwise(front):
        assert a.seconds < b.seconds and a.quality < b.quality
    for p in points:
        assert p in front or any(dominates(f, p) for f in front)


def test_when_low_precision_is_slower_fp16_alone_is_the_frontier() -> None:
    """The machine decides: with int8 and int4 slower than fp16, all-fp16 is both the cheapest
    and the best point, and every other assignment is dominated by it."""
    points = all_points(OUTCOMES, TIERS, SLOW_LOW, "fp16")
    all_fp16 = _by(points, "fp16", "fp16", "fp16")
    assert pareto(points) == [all_fp16]
    assert min(points, key=lambda p: p.seconds) == all_fp16
    actual = gateway_point(OUTCOMES, SLOW_LOW, "fp16")  # it sent tolerant to int4
    g = gap(actual, points)
    assert not g.on_frontier and g.by == all_fp16
    assert g.quality_gain == pytest.approx(1.0 - actual.quality)
    assert g.seconds_saved == pytest.approx(actual.seconds - all_fp16.seconds)


def test_a_gateway_routing_that_is_an_assignment_on_the_frontier_is_on_it() -> None:
    points = all_points(OUTCOMES, TIERS, FAST_LOW, "fp16")
    actual = gateway_point(OUTCOMES, FAST_LOW, "fp16")  # tolerant -> int4, code, math -> fp16
    assert actual.seconds == pytest.approx(_by(points, "fp16", "fp16", "int4").seconds)
    g = gap(actual, points)
    assert g.on_frontier and g.by is None
    assert (g.quality_gain, g.seconds_saved) == (0.0, 0.0)


def test_a_dominated_gateway_is_told_by_how_much() -> None:
    """Everything sent to int4 on a machine where int8 decodes faster than int4 and agrees
    better: the best assignment at its cost and the cheapest at its quality both beat it."""
    speeds = {"fp16": Speed(0.05, 0.020), "int8": Speed(0.04, 0.012), "int4": Speed(0.04, 0.016)}
    worse = [
        outcome("tolerant", "tolerant", "int4", 0.9, 0.8, out=10),
        outcome("code", "code", "int4", 0.9, 0.2, out=40),
    ]
    points = all_points(worse, TIERS, speeds, "fp16")
    actual = gateway_point(worse, speeds, "fp16")
    g = gap(actual, points)
    assert not g.on_frontier and g.by is not None and dominates(g.by, actual)
    at_cost = [p for p in points if p.seconds <= actual.seconds]
    best_at_cost = max(at_cost, key=lambda p: p.quality)
    assert g.by == best_at_cost
    assert g.quality_gain == pytest.approx(best_at_cost.quality - actual.quality)
    at_quality = [p for p in points if p.quality >= actual.quality]
    cheapest = min(p.seconds for p in at_quality)
    assert g.seconds_saved == pytest.approx(actual.seconds - cheapest)
    assert g.quality_gain > 0.4 and g.seconds_saved > 0.05
