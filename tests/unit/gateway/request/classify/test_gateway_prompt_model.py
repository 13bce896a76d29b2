"""The prompt model's features, window and scoring, on small hand-made weights files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from common.prompt_features import feature_key, feature_name, features, window
from gateway.request.classify.prompt_model import ModelError, PromptModel, combine, sigmoid

ROOT = Path(__file__).resolve().parents[5]
SHIPPED = ROOT / "classifier" / "weights" / "prompt-model-v3.json"
FIRST = ROOT / "classifier" / "weights" / "prompt-model-v1.json"


def _weights(
    precise: dict[str, float],
    code: dict[str, float] | None = None,
    bias: float = -1.0,
    head: int = 100,
    tail: int = 50,
    norm_power: object = None,
) -> bytes:
    data = {
        "format": "model-optimizer/prompt-model",
        "format_version": 1 if norm_power is None else 2,
        "name": "tiny",
        "version": 3,
        "window": {"head_chars": head, "tail_chars": tail},
        "precise": {"bias": bias, "weights": precise},
        "code": {"bias": 0.0, "weights": code or {}},
    }
    if norm_power is not None:
        data["norm_power"] = norm_power
    return json.dumps(data).encode()


TINY = PromptModel.parse(
    _weights({"w:python": 2.0, "w:poem": -2.0, "c:61": 1.0}, {"w:python": 3.0, "c:61": -1.0})
)


def test_words_are_lowercased_and_split_on_punctuation_but_plus_and_hash() -> None:
    found = features("Write C++ and C#: a Python-function, x=1!", 100, 0)
    words = {b"write", b"c++", b"and", b"c#", b"a", b"python", b"function", b"x", b"1"}
    assert found.words == words | {b"c++", b"write", b"pytho", b"funct"}  # each word's stem
    assert found.marks == {ord(c) for c in "+#:-,=1!"}
    assert found.count == len(found.words) + len(found.marks)
    assert sorted(found.names())[:2] == ["c:33", "c:35"]
    assert feature_key("w:python") == b"python" and feature_key("c:61") == 61
    assert feature_name(b"python") == "python" and feature_name(61) == "'='"


def test_non_ascii_symbols_are_marks_and_stay_inside_words() -> None:
    found = features("x ≤ 3 café", 100, 0)
    assert set("≤".encode()) <= found.marks
    assert "café".encode() in found.words


def test_the_window_is_the_head_and_the_tail() -> None:
    text = "a" * 10 + "MIDDLE" + "b" * 10
    assert window(text, 100, 50) == text
    assert window(text, 10, 10) == "a" * 10 + "\n" + "b" * 10
    assert window(text, 10, 0) == "a" * 10


def test_what_lies_outside_the_window_does_not_count() -> None:
    head, tail = "poem " * 30, " end" * 20  # 150 and 80 characters
    plain = TINY.score(head + "lorem ipsum " * 1000 + tail)
    coded = TINY.score(head + "python = python " * 1000 + tail)
    assert plain.precise == coded.precise


def test_the_score_is_bias_plus_weights_over_the_root_of_the_features_present() -> None:
    score = TINY.score("python x=1")  # words python, x, 1, the stem pytho; marks '=' and '1'
    assert score.precise == pytest.approx(-1.0 + (2.0 + 1.0) / math.sqrt(6))
    assert score.code == pytest.approx((3.0 - 1.0) / math.sqrt(6))
    assert score.p_precise == pytest.approx(sigmoid(score.precise))
    assert TINY.score("").precise == -1.0


def test_a_format_2_file_names_the_power_of_its_norm() -> None:
    weights = {"w:python": 2.0, "w:poem": -2.0, "c:61": 1.0}
    model = PromptModel.parse(_weights(weights, {"w:python": 3.0}, norm_power=0.75))
    score = model.score("python x=1")  # 6 features present, as above
    assert score.precise == pytest.approx(-1.0 + (2.0 + 1.0) / 6**0.75)
    assert score.code == pytest.approx(3.0 / 6**0.75)
    assert PromptModel.parse(_weights(weights, norm_power=0.5)).score("python x=1").precise == (
        TINY.score("python x=1").precise
    )


def test_top_features_name_what_pushed_the_score_each_way() -> None:
    score = TINY.score("a python poem, x = 1")
    assert score.top(True) == ["+python", "+'='"]
    assert score.top(False) == ["-poem"]
    assert score.top(True, 1) == ["+python"]


def test_bad_weights_files_are_one_line_errors(tmp_path: Path) -> None:
    cases = {
        "missing.json": None,
        "not-json.json": b"{",
        "wrong-format.json": json.dumps({"format": "other"}).encode(),
        "bad-weight.json": _weights({"w:python": "heavy"}),  # type: ignore[dict-item]
        "bad-kind.json": _weights({"q:python": 1.0}),
        "bad-window.json": _weights({}, head=0),
        "bad-power.json": _weights({}, norm_power=0),
        "text-power.json": _weights({}, norm_power="0.75"),
        "no-power.json": _weights({}, norm_power=0.75).replace(b'"norm_power"', b'"other"'),
        "bad-version.json": _weights({}).replace(b'"format_version": 1', b'"format_version": 3'),
    }
    for name, content in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
        with pytest.raises(ModelError) as info:
            PromptModel.load(path)
        assert "\n" not in str(info.value) and name in str(info.value)


def test_the_shipped_weights_load_with_their_version_and_window() -> None:
    model = PromptModel.load(SHIPPED)
    assert model.label == "prompt-model v3" and model.norm_power == 0.75
    assert (model.head_chars, model.tail_chars) == (1536, 512)
    assert len(model.digest) == 12
    assert SHIPPED.stat().st_size < 512 * 1024  # small enough to read on every policy reload
    metadata = model.metadata
    assert metadata["data_sha256"] and metadata["cross_validation"]
    first = PromptModel.load(FIRST)  # format 1, kept: its norm is a square root
    assert first.label == "prompt-model v1" and first.norm_power == 0.5
    second = PromptModel.load(FIRST.with_name("prompt-model-v2.json"))  # kept, not served
    assert second.label == "prompt-model v2" and second.norm_power == 0.75


def test_combine_is_a_weighted_mean() -> None:
    assert combine([(1.0, 1.0), (4.0, 0.5)]) == pytest.approx(2.0)
    assert combine([]) == 0.0
