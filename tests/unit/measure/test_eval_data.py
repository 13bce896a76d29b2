"""measure/eval_data.py: the shipped data loads; bad files are one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from measure.eval_data import (
    DATA,
    LABELS,
    EvalDataError,
    load_general,
    load_gsm8k,
    load_humaneval,
    load_labeled,
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
    items = load_general(100)
    assert len(items) == 70  # 80 Vicuna questions less 7 coding and 3 math
    assert len(load_general(3)) == 3


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
