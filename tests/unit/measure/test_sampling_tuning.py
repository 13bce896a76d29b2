"""benchmarks/tune_sampling.py: its scoring, its rule, and its data kept apart from evaluation."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location(
    "tune_sampling", ROOT / "benchmarks" / "tune_sampling.py"
)
assert _spec and _spec.loader
tune = importlib.util.module_from_spec(_spec)
sys.modules["tune_sampling"] = tune  # dataclasses look their module up
_spec.loader.exec_module(tune)


def _texts(path: Path, key: str) -> set[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {str(row[key]).strip().lower() for row in rows}


def test_tuning_questions_are_no_evaluation_or_probe_question() -> None:
    tuning = _texts(tune.QUESTIONS, "text")
    assert len(tuning) >= 40
    readme_question = "what is the capital of france?"
    assert readme_question not in tuning
    data = ROOT / "measure" / "data"
    for path, key in [
        (data / "admission_facts.jsonl", "text"),
        (data / "routing_prompts.jsonl", "prompt"),
        (data / "vicuna_bench_questions.jsonl", "turns"),
    ]:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        others = {
            str(row[key][0] if isinstance(row[key], list) else row[key]).strip().lower()
            for row in rows
        }
        assert not tuning & others, path.name
    assert "france" not in " ".join(tuning)


def test_names_any_matches_whole_words_only() -> None:
    assert tune.names_any("The capital of Italy is Rome.", ["Rome"])
    assert tune.names_any("It's H2O!", ["H2O", "H₂O"])
    assert not tune.names_any("Romeo and Juliet", ["Rome"])
    assert tune.names_any("A spider has eight legs", ["8", "eight"])
    assert not tune.names_any("eighty", ["eight"])


def _cell(temperature: float, right: int, unended: int, answers: int = 100):
    return tune.Cell(temperature, answers=answers, right=right, unended=unended)


def test_rule_takes_the_most_right() -> None:
    cells = [_cell(0.0, 60, 0), _cell(0.2, 80, 0)]
    assert tune.choose(cells).temperature == 0.2


def test_rule_prefers_answers_that_end_within_one_standard_error() -> None:
    # 0.0 is best by 2 points (inside one standard error, ~4 %) but loops more often.
    cells = [_cell(0.0, 82, 30), _cell(0.1, 80, 5), _cell(0.2, 70, 5)]
    assert tune.choose(cells).temperature == 0.1


def test_rule_breaks_ties_toward_the_model_card() -> None:
    cells = [_cell(0.0, 80, 5), _cell(0.05, 80, 5), _cell(0.2, 80, 5)]
    assert tune.choose(cells).temperature == 0.2
