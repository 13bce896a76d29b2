"""Routes derived with confidence (gateway/policy/derive.py with gateway/policy/confidence.py):
the interval rule on paired per-prompt samples, emulated tiers never ahead of the reference,
and hysteresis against a previous derivation."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from pathlib import Path

from gateway.policy.derive import DerivedChain, Goal, TierFigures, derive_chain
from gateway.policy.store import PolicyStore

ROUTE = ["int4", "int8", "fp16"]
GOAL = Goal(floor=0.6)
# A busy machine: each prompt's load, shared by the tiers measured back to back.
LOAD = [1.00, 1.12, 0.95, 1.30, 1.02, 0.98, 1.45, 1.05]


def _tier(
    name: str,
    quality: float,
    tpot: float,
    ttft: float = 0.05,
    ratios: list[float] | None = None,
    emulated: bool = False,
) -> TierFigures:
    """A tier whose prompt i costs ``LOAD[i] x ratios[i]`` times its median figures."""
    cats = {"chat": quality, "code": quality, "math": quality}
    scale = [load * r for load, r in zip(LOAD, ratios or [1.0] * len(LOAD), strict=True)]
    return TierFigures(
        name,
        cats,
        ttft,
        tpot,
        1 / tpot,
        ttfts_s=tuple(ttft * s for s in scale),
        tpots_s=tuple(tpot * s for s in scale),
        emulated=emulated,
    )


def _point(figures: TierFigures) -> TierFigures:
    """The same figures without samples (a file written before they were kept)."""
    return TierFigures(
        figures.name,
        figures.quality,
        figures.ttft_s,
        figures.tpot_s,
        figures.throughput_tok_s,
        emulated=figures.emulated,
    )


def _around_one(ratios: list[float]) -> list[float]:
    """``ratios`` scaled to a geometric mean of 1: the samples scatter around the medians."""
    mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return [r / mean for r in ratios]


# Per-prompt ratios around a tier's medians: with a 13 % point gain, an interval ~[0.0, 0.25].
STRADDLING = _around_one([0.80, 1.05, 0.70, 0.95, 0.85, 1.10, 0.75, 0.90])

# The issue's calibration: fp16 TPOT 36.6 ms, its emulated int8 copy 31.5 ms ("int8: 4.22
# s/answer; fp16: 4.89 s/answer" at 128 tokens), every class sent to int8 first.
ISSUE = {
    "fp16": _tier("fp16", 1.0, 0.0366, ttft=0.205),
    "int8": _tier("int8", 0.92, 0.0315, ttft=0.188, emulated=True),
}


def test_the_issue_s_emulated_int8_is_never_first_whatever_its_figures() -> None:
    for figures in (ISSUE, {name: _point(f) for name, f in ISSUE.items()}):
        derived = derive_chain("tolerant", ["int8", "fp16"], GOAL, figures, "fp16")
        assert derived.chain == ("fp16",)
        assert derived.overflow == ("int8",)  # a fallback only
        assert "emulated" in derived.reasons["int8"]
        assert "never cheaper than fp16" in derived.reasons["int8"]
    # The same figures from a natively served int8 would put it first: the flag decides.
    native = dict(ISSUE, int8=_tier("int8", 0.92, 0.0315, ttft=0.188))
    assert derive_chain("tolerant", ["int8", "fp16"], GOAL, native, "fp16").chain == (
        "int8",
        "fp16",
    )


def test_an_emulated_tier_costs_at_least_the_reference_where_the_route_lacks_it() -> None:
    figures = {
        "fp16": _tier("fp16", 1.0, 0.020),
        "int8": _tier("int8", 0.95, 0.015),
        "int4": _tier("int4", 0.80, 0.010, emulated=True),
    }
    derived = derive_chain("tolerant", ["int4", "int8"], GOAL, figures, "fp16")
    assert derived.chain == ("int8",)  # int4 costed as fp16 (0.020 a token): dearer than int8
    assert derived.reasons["int4"].startswith("dominated by int8")
    native = dict(figures, int4=_tier("int4", 0.80, 0.010))
    assert derive_chain("tolerant", ["int4", "int8"], GOAL, native, "fp16").chain[0] == "int4"
    # Against a tier dearer than the reference it may lead, costed as the reference.
    slow = dict(figures, int8=_tier("int8", 0.95, 0.030))
    derived = derive_chain("tolerant", ["int4", "int8"], GOAL, slow, "fp16")
    assert derived.chain == ("int4", "int8")
    assert derived.reasons["int4"].startswith("agreement 0.800, 2.61 s/answer (emulated: costed")


def test_a_gain_whose_interval_does_not_clear_min_gain_keeps_the_accurate_tier_first() -> None:
    """Point gain ~13 % from the medians, but the paired ratios scatter by -20 % to +25 %."""
    figures = {
        "fp16": _tier("fp16", 1.0, 0.0300),
        "int4": _tier("int4", 0.80, 0.0261, ratios=STRADDLING),
    }
    derived = derive_chain("tolerant", ["int4", "fp16"], GOAL, figures, "fp16")
    assert derived.chain == ("fp16",)
    reason = derived.reasons["int4"]
    assert reason.startswith("dominated by fp16 (better, and this tier's gain 0.1")
    assert "over fp16, n=8 at 95%: its lower bound does not clear 10%" in reason
    # Without the samples the point rule (13 % > 10 %) would have put int4 first, and says so.
    old = {name: _point(f) for name, f in figures.items()}
    point = derive_chain("tolerant", ["int4", "fp16"], GOAL, old, "fp16")
    assert point.chain == ("int4", "fp16")
    assert "(point figures)" in point.reasons["int4"]


def test_a_clear_gain_keeps_the_cheap_tier_first_and_shows_its_interval() -> None:
    steady = [0.58, 0.60, 0.57, 0.59, 0.58, 0.61, 0.58, 0.59]
    figures = {
        "fp16": _tier("fp16", 1.0, 0.0300),
        "int8": _tier("int8", 0.95, 0.0240),
        "int4": _tier("int4", 0.80, 0.0175, ratios=steady),
    }
    derived = derive_chain("tolerant", ROUTE, GOAL, figures, "fp16")
    assert derived.chain == ("int4", "int8", "fp16")
    # int4's closest call is against int8 (~0.26), not fp16 (~0.41)
    assert "over int8, n=8" in derived.reasons["int4"]
    assert "gain 0.20 [0.20, 0.20] over fp16, n=8" in derived.reasons["int8"]
    assert "gain 0.20 [0.20, 0.20] over fp16, n=8" in derived.describe()


def test_throughput_has_one_figure_per_tier_so_the_point_rule_decides() -> None:
    figures = {
        "fp16": _tier("fp16", 1.0, 0.0300),
        "int4": _tier("int4", 0.80, 0.0261, ratios=STRADDLING),
    }
    figures["int4"] = dataclasses.replace(figures["int4"], throughput_tok_s=50.0)
    figures["fp16"] = dataclasses.replace(figures["fp16"], throughput_tok_s=40.0)
    goal = Goal(floor=0.6, minimise="throughput")
    derived = derive_chain("tolerant", ["int4", "fp16"], goal, figures, "fp16")
    assert derived.chain == ("int4", "fp16")
    assert "gain 0.20 over fp16 (point figures)" in derived.reasons["int4"]


def test_a_tier_ahead_before_stays_until_its_gain_is_significantly_below_min_gain() -> None:
    figures = {
        "fp16": _tier("fp16", 1.0, 0.0300),
        "int4": _tier("int4", 0.80, 0.0261, ratios=STRADDLING),
    }
    before = DerivedChain("tolerant", ("int4", "fp16"))
    kept = derive_chain("tolerant", ["int4", "fp16"], GOAL, figures, "fp16", before)
    assert kept.chain == ("int4", "fp16")
    assert "kept ahead as before" in kept.reasons["int4"]
    fresh = derive_chain("tolerant", ["int4", "fp16"], GOAL, figures, "fp16")
    assert fresh.chain == ("fp16",)  # not ahead before: the lower bound must clear
    # A route written, not derived, is no previous order to keep.
    written = DerivedChain("tolerant", ("int4", "fp16"), as_written=True)
    assert derive_chain("tolerant", ["int4", "fp16"], GOAL, figures, "fp16", written) == fresh
    # Significantly below min_gain (a steady 3 %): it goes, previous order or not.
    slower = dict(figures, int4=_tier("int4", 0.80, 0.0291, ratios=[1.0, 0.99, 1.01] + [1.0] * 5))
    moved = derive_chain("tolerant", ["int4", "fp16"], GOAL, slower, "fp16", before)
    assert moved.chain == ("fp16",)
    assert "upper bound is below 10%" in moved.reasons["int4"]
    # The other way round: a tier not ahead before moves ahead only on a clear gain.
    behind = DerivedChain("tolerant", ("fp16",), overflow=("int4",))
    assert derive_chain("tolerant", ["int4", "fp16"], GOAL, figures, "fp16", behind) == fresh


POLICY = """\
tiers: [fp16, int8, int4]
routes:
  tolerant: {tiers: [int4, int8, fp16], derive: {floor: 0.6}}
  code: [fp16, int8]
  math: [fp16, int8]
  long: [fp16, int8, int4]
"""


def test_the_store_re_derives_with_hysteresis_and_reads_the_confidence(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(POLICY)
    clear = {
        "fp16": _tier("fp16", 1.0, 0.0300),
        "int4": _tier("int4", 0.80, 0.0175, ratios=[0.58] * 8),
    }
    store = PolicyStore(path, measured=clear, reference="fp16")
    assert store.load().policy.routes.tolerant.tiers == ["int4", "fp16"]
    # New figures (a re-measurement) whose gain straddles min_gain: the order holds.
    store.measured = dict(clear, int4=_tier("int4", 0.80, 0.0261, ratios=STRADDLING))
    path.write_text(POLICY.replace("floor: 0.6}", "floor: 0.6, confidence: 0.9}"))
    assert store.reload() == "applied"
    assert store.active.derived["tolerant"].chain == ("int4", "fp16")
    fresh = PolicyStore(path, measured=store.measured, reference="fp16")
    assert fresh.load().derived["tolerant"].chain == ("fp16",)
    assert "at 90%" in fresh.active.derived["tolerant"].reasons["int4"]


def _calibration(rng: random.Random, int4_ratio: float) -> dict[str, TierFigures]:
    """One simulated calibration on a busy machine: a load shared by the tiers at each prompt
    (interleaved), each request's own jitter, medians as the point figures."""
    samples: dict[str, tuple[list[float], list[float]]] = {"fp16": ([], []), "int4": ([], [])}
    for _ in range(8):
        load = rng.lognormvariate(0, 0.3)
        for name, ratio in (("fp16", 1.0), ("int4", int4_ratio)):
            ttfts, tpots = samples[name]
            ttfts.append(0.2 * load * rng.lognormvariate(0, 0.08))
            tpots.append(0.0366 * ratio * load * rng.lognormvariate(0, 0.08))
    cats = {"chat": 0.8, "code": 0.8, "math": 0.8}
    return {
        name: TierFigures(
            name,
            {k: 1.0 for k in cats} if name == "fp16" else cats,
            statistics.median(ttfts),
            statistics.median(tpots),
            1.0,
            ttfts_s=tuple(ttfts),
            tpots_s=tuple(tpots),
        )
        for name, (ttfts, tpots) in samples.items()
    }


def test_a_gain_below_min_gain_never_moves_the_route_where_the_medians_sometimes_did() -> None:
    """The issue's stability target, simulated: 100 calibrations of an int4 truly 5 % cheaper
    (below min_gain) on a loaded machine derive fp16 first every time; the point rule on the
    same figures put int4 first in some. Truly 40 % cheaper, the interval rule finds it."""

    def first(figures: dict[str, TierFigures]) -> str:
        return derive_chain("tolerant", ["int4", "fp16"], GOAL, figures, "fp16").chain[0]

    rng = random.Random(32)
    interval_first = point_first = 0
    for _ in range(100):
        figures = _calibration(rng, 0.95)
        interval_first += first(figures) == "int4"
        point_first += first({name: _point(f) for name, f in figures.items()}) == "int4"
    assert interval_first == 0
    assert point_first >= 5  # 14 of 100 with this seed
    assert all(first(_calibration(rng, 0.6)) == "int4" for _ in range(20))
