"""What /admin/routes shows (gateway/policy/routes_view.py): pinned routes checked against the
measurements, derived routes with their reasons, calibration beside live figures."""

from __future__ import annotations

from gateway.policy.derive import DerivedChain, TierFigures
from gateway.policy.route_changes import RouteChange, RouteHistory
from gateway.policy.routes_view import pin_note, routes_document
from gateway.policy.schema import parse_policy

LOAD = [1.00, 1.12, 0.95, 1.30, 1.02, 0.98, 1.45, 1.05]  # each prompt's machine load


def _tier(name: str, quality: float, tpot: float, emulated: bool = False) -> TierFigures:
    cats = {"chat": quality, "code": quality, "math": quality}
    return TierFigures(
        name, cats, 0.2, tpot, 1 / tpot,
        ttfts_s=tuple(0.2 * x for x in LOAD), tpots_s=tuple(tpot * x for x in LOAD),
        emulated=emulated,
    )  # fmt: skip


def test_a_pin_on_an_emulated_tier_is_contradicted_with_the_issues_figures() -> None:
    """The issue's machine: fp16 TPOT 36.6 ms, the emulated int8 copy 31.5 ms."""
    figures = {"fp16": _tier("fp16", 1.0, 0.0366), "int8": _tier("int8", 0.9, 0.0315, True)}
    note = pin_note("tolerant", ["int8", "fp16"], figures, "fp16")
    assert note is not None and note.startswith("pinned; measurements prefer fp16 (agreement")
    assert "int8: dominated by fp16 (emulated" in note


def test_a_pin_slower_than_a_significantly_cheaper_tier_names_its_gain() -> None:
    figures = {"fp16": _tier("fp16", 1.0, 0.0366), "int4": _tier("int4", 0.9, 0.018)}
    note = pin_note("tolerant", ["fp16", "int4"], figures, "fp16")
    assert note is not None and note.startswith("pinned; measurements prefer int4")
    assert "gain 0.4" in note and "over fp16, n=8" in note


def test_a_pin_the_measurements_agree_with_and_one_without_figures() -> None:
    figures = {"fp16": _tier("fp16", 1.0, 0.0366), "int4": _tier("int4", 0.9, 0.035)}
    agreed = pin_note("tolerant", ["fp16", "int4"], figures, "fp16")
    assert agreed is not None and agreed.startswith("pinned; measurements agree (fp16:")
    assert pin_note("tolerant", ["t0", "t1"], figures, "fp16") is None


POLICY = """tiers: [fp16, int4]
routes:
  tolerant: {tiers: [int4, fp16], derive: {floor: 0.5}}
  code: [fp16, int4]
  math: [fp16]
  long: [fp16]
"""


def test_the_document_shows_each_class_how_and_why_and_each_tiers_figures() -> None:
    policy = parse_policy(POLICY, "routing.yaml", ["fp16", "int4"])
    figures = {"fp16": _tier("fp16", 1.0, 0.0366), "int4": _tier("int4", 0.9, 0.018)}
    derived = {"tolerant": DerivedChain("tolerant", ("int4", "fp16"), {"int4": "gain 0.5"})}
    history = RouteHistory()
    history.extend([RouteChange(0.0, "tolerant", ("fp16", "int4"), ("int4", "fp16"), "why")])
    live = {"int4": {"n": 3}, "gone": {"n": 1}}
    doc = routes_document(policy, derived, figures, "fp16", history, live, {"answers": 512})
    tolerant, code = doc["classes"]["tolerant"], doc["classes"]["code"]
    assert tolerant["how"] == "derived" and tolerant["tiers"] == ["int4", "fp16"]
    assert tolerant["reasons"] == {"int4": "gain 0.5"} and "pin" not in tolerant
    assert tolerant["last_change"]["from"] == ["fp16", "int4"]
    assert code["how"] == "pinned" and code["last_change"] is None
    assert code["pin"].startswith("pinned; measurements prefer int4")
    assert doc["tiers"]["int4"]["calibration"]["tpot_ms"] == 18.0
    assert doc["tiers"]["int4"]["calibration"]["samples"] == 8
    assert doc["tiers"]["int4"]["live"] == {"n": 3}
    assert doc["tiers"]["gone"] == {"calibration": None, "live": {"n": 1}}
    assert doc["tiers"]["fp16"]["live"] is None
    assert len(doc["history"]) == 1 and doc["live_window"] == {"answers": 512}


def test_a_derived_route_without_usable_figures_shows_as_written() -> None:
    policy = parse_policy(POLICY, "routing.yaml", ["fp16", "int4"])
    derived = {"tolerant": DerivedChain("tolerant", ("int4", "fp16"), {"*": "no"}, as_written=True)}
    doc = routes_document(policy, derived, {}, None, None, {}, {})
    assert doc["classes"]["tolerant"]["how"] == "as written"
    assert doc["classes"]["code"]["pin"] is None  # pinned, but nothing measured to compare
    assert doc["history"] == [] and doc["tiers"] == {} and doc["reference"] is None
