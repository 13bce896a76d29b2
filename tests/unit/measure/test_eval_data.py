"""measure/eval_data.py: the shipped data loads; bad files are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from measure.eval_data import (
    DATA,
    LABELS,
    EvalDataError,
    calibration_texts,
    in_calibration,
    load_general,
    load_gsm8k,
    load_humaneval,
    load_labeled,
    vicuna_general,
)


def test_the_shipped_gsm8k_subset_is_held_aside_from_calibration() -> None:
    items = load_gsm8k(1000)
    assert len(items) == 100
    assert items[0].item_id == "gsm8k:1"
    calibration = (DATA.parent.parent / "optimizer" / "data" / "calibration.jsonl").read_text()
    for item in items:
        assert item.question not in calibration
        assert "<<" not in item.solution and item.answer.lstrip("-").replace(".", "").isdigit()


def test_general_questions_skip_coding_and_math() -> None:
    assert len(vicuna_general()) == 70  # 80 Vicuna questions less 7 coding and 3 math


def test_no_general_item_is_a_calibration_text() -> None:
    texts = calibration_texts()
    items = load_general(10_000)
    overlap = [item.item_id for item in items if in_calibration(item.question, texts)]
    assert overlap == []
    assert len({item.question for item in items}) == len(items)
    assert len(load_general(3)) == 3


def test_the_shipped_split_of_the_vicuna_questions() -> None:
    """62 of the 70 general Vicuna questions are calibration prompts; the 8 others (the
    precision check's chat probes) are the only Vicuna ones evaluated. docs/evaluation.md
    names them: change both together."""
    texts = calibration_texts()
    general = vicuna_general()
    assert sum(in_calibration(item.question, texts) for item in general) == 62
    items = load_general(10_000)
    vicuna = [item.item_id for item in items if item.item_id.startswith("vicuna:")]
    assert vicuna == [f"vicuna:{n}" for n in (10, 20, 30, 40, 50, 60, 79, 80)]
    rest = items[len(vicuna) :]
    assert len(rest) == 364 and all(i.item_id.startswith("self-instruct-") for i in rest)


def test_a_question_found_in_the_calibration_file_is_dropped(tmp_path: Path) -> None:
    questions = tmp_path / "questions.jsonl"
    rows = [(1, "generic", "Plan my week."), (2, "writing", "Write a haiku."), (3, "math", "1+1?")]
    questions.write_text(
        "".join(
            json.dumps({"question_id": n, "category": c, "turns": [t]}) + "\n" for n, c, t in rows
        )
    )
    calibration = tmp_path / "calibration.jsonl"
    chat = "<|im_start|>user\nWrite a haiku.<|im_end|>\n<|im_start|>assistant\n"
    calibration.write_text(json.dumps({"category": "chat", "text": chat}) + "\n")
    heldout = tmp_path / "heldout.jsonl"
    held = [("Name a colour.", "tolerant", 7), ("Sort it.", "code", 8)]
    heldout.write_text(
        "".join(
            json.dumps({"prompt": p, "label": lab, "source": f"self-instruct-seed:{n}"}) + "\n"
            for p, lab, n in held
        )
    )
    items = load_general(10, questions, calibration, heldout)
    assert [i.item_id for i in items] == ["vicuna:1", "self-instruct-seed:7"]


def test_humaneval_comes_from_the_package() -> None:
    items = load_humaneval(2)
    assert [i.task_id for i in items] == ["HumanEval/0", "HumanEval/1"]
    assert items[0].entry_point in items[0].prompt and "def check" in items[0].test


def test_the_shipped_labeled_set() -> None:
    rows = load_labeled(DATA / "routing_prompts.jsonl")
    counts = {label: sum(r.label == label for r in rows) for label in LABELS}
    assert counts == {"tolerant": 70, "code": 7, "math": 3, "long": 3}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"prompt": "hi", "label": "fast"}\n', ":1: 'label' must be one of"),
        ('\n{"prompt": "", "label": "code"}\n', ":2: 'prompt' must be a non-empty string"),
        ("not json\n", ":1: not JSON"),
        ("[1, 2]\n", ":1: not a JSON object"),
        ("\n", ": no prompts"),
    ],
)
def test_bad_labeled_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text(text)
    with pytest.raises(EvalDataError, match=message) as info:
        load_labeled(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(EvalDataError, match="cannot read"):
        load_labeled(tmp_path / "absent.jsonl")
