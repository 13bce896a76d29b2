"""The admission verdicts from recorded figures (measure/admission.py, pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from measure.admission import (
    DEFAULT_FACTS,
    AdmissionError,
    AdmissionProbe,
    ProbeFigures,
    TierVerdict,
    emulation_helps,
    fact_kept,
    fact_span,
    first_divergence,
    judge,
    load_facts,
    reference_problems,
    verdict_from_json,
    verdict_to_json,
)

FLOORS = {"chat": 0.6, "code": 0.6, "math": 0.6}


def _fig(category: str, agreement: float, positions: int = 10, **kw: object) -> ProbeFigures:
    values: dict[str, object] = {
        "forced_agreement": agreement,
        "positions": positions,
        "free_agreement": agreement,
        "first_divergence": None,
    }
    values.update(kw)
    return ProbeFigures(category=category, **values)  # type: ignore[arg-type]


def test_a_tier_above_every_floor_is_admitted_for_every_class() -> None:
    figures = [_fig("chat", 0.9), _fig("code", 0.95), _fig("math", 0.8)]
    verdict = judge("int8", "fp16", figures, FLOORS)
    assert verdict.passed
    assert verdict.admitted_classes() == ("tolerant", "code", "math", "long")
    assert "admitted" in verdict.summary()


def test_agreement_is_token_weighted_per_category() -> None:
    # 0.9 over 90 positions and 0.0 over 10: 0.81, not the mean of the two (0.45)
    figures = [_fig("code", 0.9, 90), _fig("code", 0.0, 10)]
    verdict = judge("int4", "fp16", figures, FLOORS)
    assert verdict.categories[0].forced_agreement == pytest.approx(0.81)
    assert verdict.categories[0].passed


def test_a_category_below_its_floor_keeps_the_tier_out_of_its_classes() -> None:
    figures = [_fig("chat", 0.9), _fig("code", 0.3), _fig("math", 0.8)]
    verdict = judge("int4", "fp16", figures, FLOORS)
    assert not verdict.passed
    assert verdict.passed_categories == {"chat", "math"}
    # long needs every category
    assert verdict.admitted_classes() == ("tolerant", "math")
    assert "kept out of code" in verdict.summary()
    assert "0.300 (floor 0.60)" in verdict.summary()


def test_a_lost_factual_probe_fails_its_category_whatever_the_agreement() -> None:
    broken = _fig(
        "chat",
        0.95,
        expect=("Paris",),
        answer="L'Étoile, la Marseur, la France",
        reference_answer="The capital of France is Paris.",
    )
    verdict = judge("int8", "fp16", [broken, _fig("chat", 0.95)], FLOORS)
    assert not verdict.categories[0].passed
    assert verdict.categories[0].factual_lost == ("L'Étoile, la Marseur, la France",)
    assert "answered" in verdict.summary()


def test_a_factual_probe_the_reference_also_misses_does_not_count() -> None:
    both_wrong = _fig(
        "chat", 0.9, expect=("Tokyo",), answer="Kyoto", reference_answer="It is Osaka."
    )
    assert judge("int4", "fp16", [both_wrong], FLOORS).passed


def test_the_reference_fails_when_it_misses_most_factual_probes() -> None:
    paris = AdmissionProbe("chat", "capital of France?", ("Paris",))
    tokyo = AdmissionProbe("chat", "capital of Japan?", ("Tokyo",))
    plain = AdmissionProbe("chat", "Tell me a story.")
    good = [(paris, "Paris."), (tokyo, "Tokyo"), (plain, "Once")]
    assert reference_problems(good) == []
    assert reference_problems([(paris, "Paris."), (tokyo, "Kyoto"), (plain, "x")]) == []
    problems = reference_problems([(paris, "L'Étoile"), (tokyo, "Kyoto"), (plain, "x")])
    assert len(problems) == 2


def _verdict(mode: str, chat: float, code: float, math: float) -> TierVerdict:
    figures = [_fig("chat", chat), _fig("code", code), _fig("math", math)]
    return TierVerdict("int4", "fp16", judge("int4", "fp16", figures, FLOORS).categories, mode)


@pytest.mark.parametrize(
    ("native", "emulated", "keep_emulated"),
    [
        ((0.5, 0.5, 0.5), (0.9, 0.9, 0.9), True),  # passes every category it failed
        ((0.5, 0.9, 0.9), (0.9, 0.5, 0.9), False),  # as many passed, no more agreement
        ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), False),  # broken in its weights: fails both ways
        ((0.5, 0.5, 0.5), (0.55, 0.55, 0.55), True),  # none passed, but clearly closer
        ((0.5, 0.5, 0.5), (0.505, 0.5, 0.5), False),  # within the margin: native
        ((0.9, 0.9, 0.5), (0.5, 0.5, 0.99), False),  # fewer categories, whatever the mean
    ],
)
def test_an_emulated_copy_is_kept_only_when_it_helps(
    native: tuple[float, float, float], emulated: tuple[float, float, float], keep_emulated: bool
) -> None:
    assert emulation_helps(_verdict("native", *native), _verdict("emulated", *emulated)) is (
        keep_emulated
    )


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 5, 3], [1, 2, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_verdicts_round_trip_through_json() -> None:
    verdict = judge("int8", "fp16", [_fig("chat", 0.5), _fig("code", 0.9)], FLOORS, "emulated")
    again = verdict_from_json(json.loads(json.dumps(verdict_to_json(verdict))))
    assert again == verdict
    with pytest.raises(AdmissionError):
        verdict_from_json({"tier": "x"})


def test_the_shipped_facts_load(tmp_path: Path) -> None:
    facts = load_facts(DEFAULT_FACTS)
    assert facts and all(p.expect for p in facts)
    assert {p.category for p in facts} <= {"chat", "code", "math"}
    bad = tmp_path / "f.jsonl"
    bad.write_text('{"category": "chat", "text": "hi"}\n')
    with pytest.raises(AdmissionError, match=r"f.jsonl:1: needs category, text"):
        load_facts(bad)


# "The capital of France is Paris." as SmolLM2 tokenizes it, and a tier put on that path.
PIECES = ("The", " capital", " of", " France", " is", " Paris", ".")
REFERENCE = (504, 3575, 282, 4649, 314, 7042, 30)


def test_the_facts_tokens_are_found_among_the_pieces() -> None:
    assert fact_span(PIECES, ("Paris",)) == range(5, 6)
    assert fact_span(("A", " week", " is", " ", "7", " days"), ("7", "seven")) == range(4, 5)
    assert fact_span(("Shake", "speare", " wrote"), ("shakespeare",)) == range(0, 2)
    assert fact_span(PIECES, ("Tokyo",)) is None


def test_a_fact_is_kept_when_the_tier_gives_its_tokens_on_the_references_path() -> None:
    top1 = (504, 3575, 282, 4649, 314, 7042, 11)  # differs after the word: kept
    assert fact_kept(PIECES, REFERENCE, top1, ("Paris",)) is True
    wrong = (504, 3575, 282, 4649, 314, 418, 30)  # another word where Paris stands
    assert fact_kept(PIECES, REFERENCE, wrong, ("Paris",)) is False
    assert fact_kept((), REFERENCE, top1, ("Paris",)) is None  # no pieces: not judged


def test_a_fact_is_lost_only_when_lost_both_in_the_answer_and_on_the_references_path() -> None:
    reference = "The capital of France is Paris."
    coin_toss = _fig(  # its greedy answer took the other first token; on the path: Paris
        "chat",
        0.95,
        expect=("Paris",),
        answer="L'Étoile, la Marseillaise",
        reference_answer=reference,
        fact_kept=True,
    )
    own_path = _fig(  # off the reference's path, yet its own answer names it
        "chat",
        0.95,
        expect=("Paris",),
        answer="Paris is the capital.",
        reference_answer=reference,
        fact_kept=False,
    )
    broken = _fig(
        "chat",
        0.95,
        expect=("Paris",),
        answer="L'Étoile, la Marseur",
        reference_answer=reference,
        fact_kept=False,
    )
    assert not coin_toss.factual_lost and not own_path.factual_lost and broken.factual_lost
    verdict = judge("int8", "fp16", [coin_toss, own_path, _fig("chat", 0.95)], FLOORS)
    assert verdict.passed
