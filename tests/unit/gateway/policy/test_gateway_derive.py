"""Routes derived from measured quality and speed (gateway/policy/derive.py, pure)."""

from __future__ import annotations

from pathlib import Path

from gateway.policy.derive import DerivedChain, Goal, TierFigures, derive_chain, derive_routes
from gateway.policy.schema import parse_policy
from gateway.policy.store import PolicyStore

ROUTE = ["int4", "int8", "fp16"]


def _tier(
    name: str, quality: float, tpot: float, ttft: float = 0.05, tput: float = 0.0
) -> TierFigures:
    cats = {"chat": quality, "code": quality, "math": quality}
    return TierFigures(name, cats, ttft, tpot, tput or 1 / tpot)


def test_the_cheapest_tier_meeting_the_floor_goes_first_and_the_reference_last() -> None:
    figures = {
        "fp16": _tier("fp16", 1.0, 0.019),
        "int8": _tier("int8", 0.95, 0.016),
        "int4": _tier("int4", 0.80, 0.012),
    }
    derived = derive_chain("tolerant", ROUTE, Goal(floor=0.6), figures, "fp16")
    assert derived.chain == ("int4", "int8", "fp16")
    strict = derive_chain("code", ROUTE, Goal(floor=0.9), figures, "fp16")
    assert strict.chain == ("int8", "fp16")
    assert "int4" in strict.reasons and "< floor 0.90" in strict.reasons["int4"]


def test_a_low_precision_tier_that_is_slower_and_worse_is_left_out() -> None:
    """The AVX-512 EPYC case: int4 decodes slower than fp16 and agrees less."""
    figures = {
        "fp16": _tier("fp16", 1.0, 0.0187),
        "int8": _tier("int8", 0.95, 0.0164),
        "int4": _tier("int4", 0.65, 0.0261),
    }
    derived = derive_chain("tolerant", ROUTE, Goal(floor=0.6), figures, "fp16")
    assert derived.chain == ("int8", "fp16")
    assert derived.reasons["int4"].startswith("dominated by")
    assert derived.overflow == ("int4",)  # only when int8 and fp16 cannot take a request
    assert derived.tiers == ("int8", "fp16", "int4")
    strict = derive_chain("tolerant", ROUTE, Goal(floor=0.6, overflow=False), figures, "fp16")
    assert strict.tiers == ("int8", "fp16")


def test_a_less_accurate_tier_must_be_min_gain_cheaper_and_the_reason_says_so() -> None:
    """The AMX Xeon case: every tier within 10 % of fp16's cost, each less accurate."""
    figures = {
        "fp16": _tier("fp16", 1.0, 0.0565),
        "int8": _tier("int8", 0.976, 0.0517),
        "int4": _tier("int4", 0.80, 0.0489),
    }
    derived = derive_chain("tolerant", ROUTE, Goal(floor=0.6), figures, "fp16")
    assert derived.chain == ("fp16",)
    assert derived.reasons["int8"] == (
        "dominated by fp16 (better, and this tier is not more than 10% cheaper "
        "(point figures: no per-prompt samples)): overflow only"
    )
    assert derived.reasons["int4"].startswith(
        "dominated by int8 (better, and this tier is not more"
    )
    # Overflow goes by cost, but int4 never before the int8 that dominates it.
    assert derived.overflow == ("int8", "int4")
    slower = derive_chain("tolerant", ROUTE, Goal(floor=0.6), dict(figures, int4=_tier(
        "int4", 0.80, 0.07)), "fp16")  # fmt: skip
    assert slower.reasons["int4"].startswith(
        "dominated by int8 (as good or better, and as cheap or cheaper)"
    )


def test_overflow_never_puts_a_tier_before_one_that_dominates_it() -> None:
    """Dominance with min_gain is not transitive: a beats b, c beats a but not b."""
    figures = {
        "ref": _tier("ref", 1.0, 0.0105),
        "a": _tier("a", 0.95, 0.0100),
        "b": _tier("b", 0.90, 0.0091),
        "c": _tier("c", 0.98, 0.0110),
    }
    derived = derive_chain("tolerant", ["a", "b", "c", "ref"], Goal(floor=0.6), figures, "ref")
    assert derived.chain == ("ref",)
    assert derived.overflow == ("c", "a", "b")  # b is cheapest, but a beats it


def test_the_reference_stays_last_even_when_it_is_the_fastest() -> None:
    figures = {
        "fp16": _tier("fp16", 1.0, 0.010),
        "int8": _tier("int8", 0.95, 0.016),
        "int4": _tier("int4", 0.80, 0.030),
    }
    derived = derive_chain("tolerant", ROUTE, Goal(floor=0.6), figures, "fp16")
    # int8 and int4 are slower and worse than fp16 (dominated): fp16 alone
    assert derived.chain == ("fp16",)


def test_throughput_goal_orders_by_seconds_per_token_under_load() -> None:
    figures = {
        "fp16": _tier("fp16", 1.0, 0.019, tput=121),
        "int8": _tier("int8", 0.95, 0.016, tput=140),
        "int4": _tier("int4", 0.80, 0.012, tput=77),
    }
    goal = Goal(floor=0.6, minimise="throughput")
    derived = derive_chain("tolerant", ROUTE, goal, figures, "fp16")
    assert derived.chain == ("int8", "fp16")  # int4 fewer tokens/s and worse: dominated


def test_long_reads_the_worst_category() -> None:
    fp16 = _tier("fp16", 1.0, 0.02)
    int4 = TierFigures("int4", {"chat": 0.9, "code": 0.5, "math": 0.9}, 0.05, 0.01, 100)
    derived = derive_chain(
        "long", ["int4", "fp16"], Goal(floor=0.6), {"fp16": fp16, "int4": int4}, "fp16"
    )
    assert derived.chain == ("fp16",)
    assert "0.500" in derived.reasons["int4"]


def test_without_measurements_the_route_stays_as_written() -> None:
    derived = derive_chain("tolerant", ROUTE, Goal(floor=0.6), {}, "fp16")
    assert derived.chain == tuple(ROUTE)
    assert "as written" in derived.describe()


def test_a_floor_no_tier_meets_keeps_the_route_as_written() -> None:
    figures = {"int4": _tier("int4", 0.5, 0.01), "int8": _tier("int8", 0.5, 0.01)}
    derived = derive_chain("tolerant", ["int4", "int8"], Goal(floor=0.9), figures, "fp16")
    assert derived.chain == ("int4", "int8")
    assert "no measured tier meets the floor" in derived.reasons["*"]
    assert isinstance(derived, DerivedChain)


def test_a_less_accurate_tier_must_be_clearly_cheaper_to_stay() -> None:
    """Emulated int8 runs at fp16's speed: 2 % faster by noise is no reason to lose quality."""
    figures = {"fp16": _tier("fp16", 1.0, 0.0190), "int8": _tier("int8", 0.95, 0.0186)}
    derived = derive_chain("tolerant", ["int8", "fp16"], Goal(floor=0.6), figures, "fp16")
    assert derived.chain == ("fp16",)
    clearly = {"fp16": _tier("fp16", 1.0, 0.0190), "int8": _tier("int8", 0.95, 0.0150)}
    derived = derive_chain("tolerant", ["int8", "fp16"], Goal(floor=0.6), clearly, "fp16")
    assert derived.chain == ("int8", "fp16")


POLICY = """\
tiers: [fp16, int8, int4]
routes:
  tolerant: {tiers: [int4, int8, fp16], derive: {floor: 0.6}}
  code: {tiers: [fp16, int8], derive: {floor: 0.9, minimise: throughput}}
  math: [fp16, int8]
  long: {strategy: most_free_kv, tiers: [fp16, int8, int4]}
"""


def test_derive_routes_replaces_only_the_derive_routes(tmp_path: Path) -> None:
    policy = parse_policy(POLICY, "p.yaml")
    figures = {
        "fp16": _tier("fp16", 1.0, 0.0187, tput=121),
        "int8": _tier("int8", 0.95, 0.0164, tput=140),
        "int4": _tier("int4", 0.65, 0.0261, tput=77),
    }
    derived_policy, derived = derive_routes(policy, figures, "fp16")
    # int4 is slower and worse than int8: never preferred, kept after fp16 for overload only
    assert derived_policy.routes.tolerant.tiers == ["int8", "fp16", "int4"]
    assert derived["tolerant"].chain == ("int8", "fp16")
    assert derived["tolerant"].overflow == ("int4",)
    assert derived_policy.routes.code.tiers == ["int8", "fp16"]
    assert derived_policy.routes.math.tiers == ["fp16", "int8"]  # as written: no derive
    assert derived_policy.routes.long.strategy == "most_free_kv"
    assert set(derived) == {"tolerant", "code"}
    assert policy.routes.tolerant.tiers == ["int4", "int8", "fp16"]  # the input is untouched
    assert derive_routes(policy, {}, "fp16") == (policy, {})


def test_the_store_serves_derived_routes_and_shows_why(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(POLICY)
    figures = {
        "fp16": _tier("fp16", 1.0, 0.0187),
        "int8": _tier("int8", 0.5, 0.0164),
        "int4": _tier("int4", 0.8, 0.0100),
    }
    store = PolicyStore(path, measured=figures, reference="fp16")
    active = store.load()
    assert active.policy.routes.tolerant.tiers == ["int4", "fp16"]
    status = store.status()
    entry = status["derived_routes"]["tolerant"]
    assert entry["chain"] == ["int4", "fp16"]
    assert "< floor 0.60" in entry["reasons"]["int8"]
    assert status["policy"]["routes"]["tolerant"]["tiers"] == ["int4", "fp16"]
    # an edit is derived again on reload
    path.write_text(POLICY.replace("floor: 0.6}", "floor: 0.9}"))
    assert store.reload() == "applied"
    assert store.active.policy.routes.tolerant.tiers == ["fp16"]


def test_a_tier_not_admitted_for_the_class_is_left_out() -> None:
    figures = {
        "fp16": _tier("fp16", 1.0, 0.02),
        "int8": TierFigures("int8", {"chat": 0.95}, 0.05, 0.01, 100, frozenset({"code"})),
    }
    derived = derive_chain("tolerant", ["int8", "fp16"], Goal(floor=0.6), figures, "fp16")
    assert derived.chain == ("fp16",)
    assert derived.reasons["int8"] == "not admitted for tolerant by the in-engine check"
