"""Routes derived from measured quality and speed (gateway/derive.py, pure)."""

from __future__ import annotations

from gateway.policy.derive import DerivedChain, Goal, TierFigures, derive_chain

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
        "int8": _tier("int8", 0.95, 0.016, tput=132),
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
