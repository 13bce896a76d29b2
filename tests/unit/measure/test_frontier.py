"""measure/frontier.py: confusion, shares, assignments and the Pareto frontier."""

from __future__ import annotations

import itertools

import pytest

from measure.frontier import Outcome, Point, all_points, confusion, gateway_point, pareto, shares

TIERS = ("fp16", "int8", "int4")
CLASSES = ("tolerant", "code", "math", "long")


def outcome(label: str, cls: str, tier: str, q8: float, q4: float, tokens: int = 10) -> Outcome:
    return Outcome(
        label=label,
        route_class=cls,
        route_tier=tier,
        gateway_tokens=tokens,
        gateway_quality={"fp16": 1.0, "int8": q8, "int4": q4}[tier],
        tokens={"fp16": tokens, "int8": tokens, "int4": tokens},
        quality={"fp16": 1.0, "int8": q8, "int4": q4},
    )


OUTCOMES = [
    outcome("tolerant", "tolerant", "int4", 0.9, 0.8, tokens=30),
    outcome("tolerant", "code", "fp16", 0.9, 0.7, tokens=10),
    outcome("code", "code", "fp16", 0.5, 0.2, tokens=10),
    outcome("math", "math", "fp16", 0.6, 0.1, tokens=50),
]


def test_confusion_counts_every_prompt_once() -> None:
    matrix = confusion(OUTCOMES, CLASSES)
    assert matrix["tolerant"] == {"tolerant": 1, "code": 1, "math": 0, "long": 0}
    assert matrix["code"]["code"] == 1 and matrix["math"]["math"] == 1
    assert sum(sum(row.values()) for row in matrix.values()) == len(OUTCOMES)


def test_shares_sum_to_one() -> None:
    got = shares(OUTCOMES, TIERS)
    assert got["int4"] == {"requests": 0.25, "tokens": 0.3}
    assert got["fp16"]["requests"] == 0.75 and got["int8"]["requests"] == 0.0
    assert sum(s["requests"] for s in got.values()) == pytest.approx(1.0)
    assert sum(s["tokens"] for s in got.values()) == pytest.approx(1.0)


def test_all_fp16_is_quality_one_at_no_saving() -> None:
    points = all_points(OUTCOMES, TIERS, "fp16")
    assert len(points) == 3**3  # three classes seen
    base = next(p for p in points if all(t == "fp16" for _, t in p.assignment))
    assert (base.cheap_share, base.quality) == (0.0, 1.0)
    cheapest = next(p for p in points if all(t == "int4" for _, t in p.assignment))
    assert cheapest.cheap_share == 1.0
    assert cheapest.quality == pytest.approx((0.8 + 0.7 + 0.2 + 0.1) / 4)


def test_the_gateway_point_uses_what_it_did() -> None:
    p = gateway_point(OUTCOMES, "fp16")
    assert p.cheap_share == pytest.approx(0.3)
    assert p.quality == pytest.approx((0.8 + 1 + 1 + 1) / 4)


def test_pareto_keeps_only_undominated_points() -> None:
    pts = [
        Point((("a", "x"),), 0.0, 1.0),
        Point((("a", "y"),), 0.5, 0.9),
        Point((("a", "z"),), 0.4, 0.8),  # dominated by (0.5, 0.9)
        Point((("a", "w"),), 1.0, 0.5),
        Point((("a", "v"),), 1.0, 0.4),  # dominated by (1.0, 0.5)
    ]
    front = pareto(pts)
    assert [(p.cheap_share, p.quality) for p in front] == [(0.0, 1.0), (0.5, 0.9), (1.0, 0.5)]


def test_pareto_of_real_points_contains_the_extremes() -> None:
    front = pareto(all_points(OUTCOMES, TIERS, "fp16"))
    assert front[0].quality == 1.0 and front[-1].cheap_share == 1.0
    for a, b in itertools.pairwise(front):
        assert a.cheap_share < b.cheap_share and a.quality > b.quality
