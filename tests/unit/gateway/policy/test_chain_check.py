"""gateway/policy/chain_check.py: static routes against measured figures (plain values)."""

from __future__ import annotations

from gateway.policy.chain_check import ChainWarning, check_chains, route_lines
from gateway.policy.derive import TierFigures
from gateway.policy.schema import RoutingPolicy, parse_policy

FLOORS = {"chat": 0.5, "code": 0.5, "math": 0.5}
LINES = {"tolerant": 11, "code": 12, "math": 13, "long": 14}


def _policy(routes: str) -> RoutingPolicy:
    return parse_policy(f"tiers: [fp16, int8, int4]\nroutes:\n{routes}", "p.yaml", None)


STATIC = """\
  tolerant: [int4, int8, fp16]
  code: [fp16, int8]
  math: [fp16, int8]
  long: {strategy: most_free_kv, tiers: [fp16, int8, int4]}
"""


def _tier(
    name: str, quality: float, tpot: float, classes: set[str] | None = None, ttft: float = 0.05
) -> TierFigures:
    q = dict.fromkeys(("chat", "code", "math"), quality)
    return TierFigures(name, q, ttft, tpot, 1 / tpot, frozenset(classes) if classes else None)


def _check(routes: str, figures: dict[str, TierFigures]) -> list[ChainWarning]:
    return check_chains(_policy(routes), figures, "fp16", FLOORS, LINES)


def test_a_chain_that_agrees_with_the_measurements_has_no_warning() -> None:
    figures = {  # low precision faster here, all admitted
        "fp16": _tier("fp16", 1.0, 0.020),
        "int8": _tier("int8", 0.92, 0.016),
        "int4": _tier("int4", 0.70, 0.012),
    }
    assert _check(STATIC, figures) == []


def test_a_first_tier_slower_and_worse_than_a_later_one_is_warned() -> None:
    """The AVX-512 EPYC case: int4 decodes slower than fp16 and int8 and agrees less."""
    figures = {
        "fp16": _tier("fp16", 1.0, 0.0187),
        "int8": _tier("int8", 0.92, 0.0164),
        "int4": _tier("int4", 0.65, 0.0261),
    }
    found = _check(STATIC, figures)
    assert [(w.cls, w.tier, w.line) for w in found] == [("tolerant", "int4", 11)]
    text = found[0].render("policies/routing.yaml")
    assert text.startswith("policies/routing.yaml:11: routes.tolerant: warning: int4 (")
    assert "is served before int8 (agreement 0.920;" in text and "later in the chain" in text
    assert "TPOT 26.1 ms" in text and "TPOT 16.4 ms" in text
    assert "faster and more accurate" in text


def test_a_better_tier_missing_from_the_chain_is_named() -> None:
    figures = {
        "fp16": _tier("fp16", 1.0, 0.019),
        "int8": _tier("int8", 0.92, 0.016),
        "int4": _tier("int4", 0.65, 0.026),
    }
    found = _check(STATIC.replace("[int4, int8, fp16]", "[int4]"), figures)
    assert [(w.cls, w.tier) for w in found] == [("tolerant", "int4")]
    assert "int8 (" in found[0].message and "not in the chain" in found[0].message


def test_a_worse_tier_as_fallback_after_a_better_one_is_fine() -> None:
    figures = {
        "fp16": _tier("fp16", 1.0, 0.010),  # fastest and best: everything else is dominated
        "int8": _tier("int8", 0.92, 0.016),
        "int4": _tier("int4", 0.65, 0.026),
    }
    routes = STATIC.replace("[int4, int8, fp16]", "[fp16, int8, int4]")
    assert _check(routes, figures) == []
    found = _check(routes.replace("code: [fp16, int8]", "code: [int8, fp16]"), figures)
    assert [(w.cls, w.tier) for w in found] == [("code", "int8")]
    assert "fp16 (agreement 1.000;" in found[0].message


def test_a_tier_not_admitted_or_below_the_floor_is_warned() -> None:
    figures = {
        "fp16": _tier("fp16", 1.0, 0.020),
        "int8": _tier("int8", 0.92, 0.016, classes={"tolerant", "math"}),  # not code, not long
        "int4": _tier("int4", 0.40, 0.012),  # admitted everywhere by an older check
    }
    found = _check(STATIC, figures)
    got = {(w.cls, w.tier): w.message for w in found}
    assert set(got) == {("tolerant", "int4"), ("code", "int8"), ("long", "int8"), ("long", "int4")}
    assert "not admitted for code by the in-engine check (skipped)" in got[("code", "int8")]
    assert "agreement on chat 0.400 < admission floor 0.50" in got[("tolerant", "int4")]
    assert got[("long", "int4")].count("< admission floor") == 3  # chat, code and math


def test_derived_routes_and_unmeasured_tiers_are_not_checked() -> None:
    figures = {"fp16": _tier("fp16", 1.0, 0.010), "int4": _tier("int4", 0.40, 0.030)}
    derived = STATIC.replace(
        "tolerant: [int4, int8, fp16]", "tolerant: {tiers: [int4, fp16], derive: {floor: 0.3}}"
    )
    found = _check(derived, figures)
    assert [w.cls for w in found] == ["long"]  # only the static route naming int4
    assert _check(STATIC, {}) == []


def test_most_free_kv_routes_are_not_judged_by_order() -> None:
    figures = {
        "fp16": _tier("fp16", 1.0, 0.010),
        "int8": _tier("int8", 0.92, 0.016),
        "int4": _tier("int4", 0.65, 0.026),
    }
    found = _check(STATIC.replace("[int4, int8, fp16]", "[fp16, int8, int4]"), figures)
    assert found == []  # long: most_free_kv of fp16, int8, int4 has no "first" tier


def test_route_lines_point_at_each_route() -> None:
    text = "tiers: [fp16]\n# a comment\nroutes:\n" + STATIC
    assert route_lines(text, "p.yaml") == {"tolerant": 4, "code": 5, "math": 6, "long": 7}
